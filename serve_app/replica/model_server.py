"""ModelServer: the Ray Serve deployment class, one deployment per configured model.

A replica pins its NeuronCores (Ray sets NEURON_RT_VISIBLE_CORES for the `neuron_cores` it asked for;
we check it is a contiguous set of exactly tp cores) and runs its engine in a process of its own
(`engine_process.EngineProcess`: the engine built by the factory `ModelSpec.engine` names, each request
tokenized and validated there, the continuous-batching loop on its one engine thread), so Serve's work
in this process never holds the interpreter lock the engine's steps need.

`generate` (streams) is an async generator of `serve_app.events` values, `complete` (non-streaming) one
call returning the `Finished`. Each request becomes a sequence in the engine's scheduler; its events
come back through a `handoff.Inbox`, as the engine process paces them (`serve_app.replica.pacing`: a stream's
tokens at most once per `stream_interval_ms`, each message costs more than a token on busy cores). A
stream yields a `Delta` per message and a `Finished` carrying the tail. A client that disconnects
cancels the request: its sequence leaves the batch (or the waiting queue) at the next step boundary. Serve's
`max_ongoing_requests` bounds the requests a replica holds (running + waiting in the engine); beyond
`max_queued_requests` callers are turned away with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from neuron_workers.engine.events import ErrorEvent
from serve_app.config import ModelSpec
from serve_app.events import HEADERS_WITHIN_S, Delta, Failed, Finished, GenerateRequest, Started
from serve_app.ops.metrics import ServerMetrics
from serve_app.ops.nodes import build_engine_here
from serve_app.replica.engine_process import EngineProcess, Prepared, Refused, Reply, Token
from serve_app.replica.handoff import Handoff, Inbox

log = logging.getLogger("ray.serve")


def failure(ev: ErrorEvent) -> Failed:
    """A sequence's error: the request's own when it names a field (its grammar failed while it ran)."""
    if ev.param is not None:
        return Failed(400, ev.message, "invalid_value", param=ev.param)
    return Failed(500, f"generation failed: {ev.message}", "internal_error", type="server_error")


def check_visible_cores(spec: ModelSpec, env: dict | None = None) -> list[int]:
    """The NeuronCores Ray gave this replica; raises unless it is a contiguous set of exactly tp cores."""
    if spec.backend != "neuron":
        return []
    value = (env if env is not None else os.environ).get("NEURON_RT_VISIBLE_CORES", "")
    try:
        cores = sorted(int(c) for c in value.replace(" ", "").split(",") if c)
    except ValueError:
        cores = []
    ok = len(cores) == spec.tp and cores == list(range(cores[0], cores[0] + spec.tp)) if cores else False
    if not ok:
        raise RuntimeError(
            f"model {spec.name!r} needs {spec.tp} contiguous NeuronCore(s) but NEURON_RT_VISIBLE_CORES="
            f"{value!r}: deploy it with ray_actor_options resources {{'neuron_cores': {spec.tp}}} on a Ray "
            f"cluster started on an inf2 instance")
    return cores


def _resolve(fut: asyncio.Future, item) -> None:
    if not fut.done():
        fut.set_result(item)


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class ModelServer:
    def __init__(self, spec: dict):
        self.spec = ModelSpec(**spec)
        self.cores = check_visible_cores(self.spec)
        self.stats = {"requests": 0, "completed": 0, "cancelled": 0, "failed": 0, "active": 0}
        self.metrics = ServerMetrics(self.spec.name)
        self.engine = build_engine_here(self.spec, lambda s: EngineProcess(s, on_step=self.metrics.step))
        log.info("model %s ready (backend %s, tp %d, cores %s, context %d, max_batch %d, engine CPUs %s)",
                 self.spec.name, self.spec.backend, self.spec.tp, self.cores, self.engine.max_context,
                 self.engine.max_batch, self.engine_cpus or "any")

    async def ready(self) -> dict:
        return {"name": self.spec.name, "max_context": self.engine.max_context, "cores": self.cores,
                "max_batch": self.engine.max_batch, "engine_cpus": self.engine_cpus}

    async def get_stats(self) -> dict:
        s = self.engine.stats
        return {**self.stats, "engine_steps": self.engine.steps, "running": s.running if s else 0,
                "waiting": s.waiting if s else 0}

    @property
    def engine_cpus(self) -> list[int] | None:
        """The host CPUs the engine process runs on (None: wherever the OS runs it)."""
        return getattr(self.engine, "info", {}).get("cpus")

    def check_health(self) -> None:
        """Serve's health probe: a replica whose engine process died cannot serve."""
        if not self.engine.alive():
            raise RuntimeError(f"the engine process of {self.spec.name} has stopped")

    async def generate(self, req: GenerateRequest):
        """A request's events (`serve_app.events`): a stream's Deltas and Finished, or only Finished."""
        self.stats["requests"] += 1
        self.stats["active"] += 1
        timer = self.metrics.request()
        outcome = "abort"  # what the metrics record if the caller goes away first
        try:
            async with contextlib.aclosing(self._run(req, timer)) as run:  # its finally runs when we stop
                async for ev in run:
                    if isinstance(ev, (Finished, Failed)):
                        outcome = ev.finish_reason if isinstance(ev, Finished) else "error"
                    yield ev
        finally:
            self.stats["active"] -= 1
            self.stats[{"abort": "cancelled", "error": "failed"}.get(outcome, "completed")] += 1
            self.metrics.finish(outcome)

    async def complete(self, req: GenerateRequest) -> Finished | Failed:
        """A non-streaming request in one call and one answer (a stream's generator costs a message more)."""
        async with contextlib.aclosing(self.generate(req)) as events:
            async for ev in events:
                if isinstance(ev, (Finished, Failed)):
                    return ev
        raise RuntimeError("the request ended without a result")

    async def call(self, name: str, args: tuple) -> dict | Failed:
        """Tokenizer work on the engine process (`tokenize`, `detokenize`): its answer, or Failed."""
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self.engine.submit((name, args), lambda item: loop.call_soon_threadsafe(_resolve, answer, item), op="call")
        item = await answer
        if isinstance(item, Reply):
            return item.result
        if isinstance(item, Refused):
            return item.failed
        return Failed(503, "the engine process stopped", "replica_unavailable", type="server_error")

    async def _run(self, req: GenerateRequest, timer):
        handoff = self._handoff()
        inbox, prompt, answered = Inbox(handoff), [0, False], asyncio.get_running_loop().create_future()
        stream = req.stream

        def sink(item) -> None:  # the reader thread: a prompt length is noted, the rest handed off
            if not answered.done():  # the engine's first word on it: prepared, refused, or failed
                handoff.call(_settle, answered)
            if isinstance(item, Prepared):
                prompt[0], prompt[1] = item.prompt_tokens, item.in_thought
                timer.prompt(item.prompt_tokens)
            else:
                inbox.push(item.at if isinstance(item, Token) and item.at else time.perf_counter(), item)

        rid = self.engine.submit(req, sink)
        text, ids, lps, n, done, scored = [], [], [], 0, False, ()
        try:
            if stream:  # a refusal is a status code: no Started before the request is prepared
                await answered
            batch = await self._first(inbox) if stream else None
            if stream and batch is None:
                yield Started(prompt[0], prompt[1])
            while True:
                # a stream wakes for each message of the engine process, a non-streaming request for its last
                if batch is None:
                    batch = await inbox.take(until_final=not stream)
                for _, item in batch:
                    if isinstance(item, Refused):
                        done = True
                        yield item.failed
                        return
                    if isinstance(item.event, ErrorEvent):
                        done = True
                        yield failure(item.event)
                        return
                    n += 1
                    scored = getattr(item.event, "prompt_logprobs", None) or scored  # the first event's entries
                    text.append(item.event.text)
                    ids.append(item.event.token_id)
                    if item.logprob_entry is not None:
                        lps.append(item.logprob_entry)
                timer.tokens([at for at, _ in batch], batch[0][1].admitted_at)
                final, batch = batch[-1][1], None
                if final.final:  # the tail rides on Finished: one message, not two
                    done = True
                    yield Finished(final.event.finish_reason, prompt[0], n, "".join(text), tuple(lps), prompt[1],
                                   scored, getattr(final.event, "stop_str", None))
                    return
                if stream and ids:
                    yield Delta("".join(text), tuple(ids), tuple(lps), prompt[1], prompt[0], scored)
                    text, ids, lps, scored = [], [], [], ()
        finally:  # the caller went away (cancelled, or stopped reading): free the slot at the next step
            if not done:
                self.engine.cancel(rid)

    @staticmethod
    async def _first(inbox: Inbox) -> list | None:
        """A stream's first events, if they come within HEADERS_WITHIN_S; None: send `Started` first."""
        try:
            return await asyncio.wait_for(inbox.take(until_final=False), HEADERS_WITHIN_S)
        except TimeoutError:
            return None

    def _handoff(self) -> Handoff:
        """The reader thread -> event loop hand-off, one per loop (one wake-up per message for all requests)."""
        loop = asyncio.get_running_loop()
        if getattr(self, "_handoff_", None) is None or self._handoff_.loop is not loop:
            self._handoff_ = Handoff(loop)
        return self._handoff_

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close(timeout=3.0)
