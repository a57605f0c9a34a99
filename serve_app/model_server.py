"""ModelServer: the Ray Serve deployment class, one deployment per configured model.

A replica pins its NeuronCores (Ray sets NEURON_RT_VISIBLE_CORES for the `neuron_cores` it asked for;
we check it is a contiguous set of exactly tp cores), builds its engine through an injected factory, and
runs the host side itself: tokenization (on a worker thread, off the event loop and off the engine
thread), and the engine's continuous-batching loop on its one engine thread (`EngineLoop`).

`generate` (streams) is an async generator of `serve_app.events` values, `complete` (non-streaming) one
call returning the `Finished`. Each request becomes a sequence in the engine's scheduler; its events
come back through a `handoff.Inbox`. A stream yields coalesced `Delta`s (every token that arrived since
the last yield, at most one message per `stream_interval_ms`: each message costs more than a token on
2 busy cores) and a `Finished` carrying the tail. A client
that disconnects cancels the request: its sequence leaves the batch (or the waiting queue) at the next
step boundary. Serve's `max_ongoing_requests` bounds the requests a replica holds (running + waiting in
the engine); beyond `max_queued_requests` callers are turned away with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import time

from neuron_workers.engine.events import ErrorEvent
from neuron_workers.engine.loop import ServingEngine
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import ContextLengthError, UserError
from serve_app import prepare
from serve_app.config import ModelSpec
from serve_app.events import HEADERS_WITHIN_S, Delta, Failed, Finished, GenerateRequest, Started
from serve_app.handoff import Handoff, Inbox
from serve_app.metrics import ServerMetrics
from serve_app.nodes import build_engine_here

log = logging.getLogger("ray.serve")


def import_attr(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


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


class ModelServer:
    def __init__(self, spec: dict):
        self.spec = ModelSpec(**spec)
        self.cores = check_visible_cores(self.spec)
        from neuron_workers.engine.loop import EngineLoop  # torch arrives with the engine, not with this module

        self.engine: ServingEngine = build_engine_here(self.spec, import_attr(self.spec.engine))
        self.stats = {"requests": 0, "completed": 0, "cancelled": 0, "failed": 0, "active": 0}
        self.streams = 0  # streaming requests in flight (they share stream_messages_per_s)
        self.metrics = ServerMetrics(self.spec.name)
        self.loop = EngineLoop(self.engine, name=f"engine-{self.spec.name}", on_step=self.metrics.step)
        log.info("model %s ready (backend %s, tp %d, cores %s, context %d, max_batch %d)", self.spec.name,
                 self.spec.backend, self.spec.tp, self.cores, self.engine.max_context, self.engine.max_batch)

    async def ready(self) -> dict:
        return {"name": self.spec.name, "max_context": self.engine.max_context, "cores": self.cores,
                "max_batch": self.engine.max_batch}

    async def get_stats(self) -> dict:
        sch = self.engine.scheduler
        return {**self.stats, "engine_steps": self.loop.steps, "running": len(sch.running), "waiting": len(sch.waiting)}

    def check_health(self) -> None:
        """Serve's health probe: a replica whose engine thread died cannot serve."""
        if not self.loop.thread.is_alive():
            raise RuntimeError(f"the engine thread of {self.spec.name} has stopped")

    def _prepare(self, req: GenerateRequest):
        """Tokenize and validate (runs on a worker thread); returns a sequence ready for the engine."""
        eng = self.engine
        if req.kind == "chat":
            self._check_text_length(sum(len(m.get("content") or "") for m in req.messages), "messages")
            ids = prepare.chat_ids(eng, req)
        elif isinstance(req.prompt, str):
            self._check_text_length(len(req.prompt), "prompt")
            ids = eng.encode(req.prompt)
        else:
            ids = list(req.prompt)
        max_tokens = req.max_tokens or max(eng.max_context - len(ids), 1)
        sampling = {**eng.sampling_defaults, **dict(req.sampling)}
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=req.ignore_eos, **sampling)
        return eng.new_sequence(ids, params, list(req.stop), **prepare.sequence_options(eng, req))

    def _check_text_length(self, chars: int, param: str) -> None:
        """Refuse, without tokenizing it, a text that cannot fit: no token is longer than
        `max_token_chars`, so it has at least chars / max_token_chars tokens."""
        at_least = chars // max(self.engine.max_token_chars, 1)
        if at_least > self.engine.max_context:
            raise ContextLengthError(f"this model's context is {self.engine.max_context} tokens; the {param} has "
                                     f"{chars} characters, at least {at_least} tokens", param=param)

    async def generate(self, req: GenerateRequest):
        """A request's events (`serve_app.events`): a stream's Deltas and Finished, or only Finished."""
        self.stats["requests"] += 1
        self.stats["active"] += 1
        timer = self.metrics.request()
        outcome = "abort"  # what the metrics record if the caller goes away first
        try:
            try:
                seq = await asyncio.to_thread(self._prepare, req)
            except UserError as e:
                outcome = "error"
                yield Failed(400, str(e), e.code, e.param)
                return
            async for ev in self._run(seq, req.stream, timer):
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

    async def _run(self, seq, stream: bool, timer):
        inbox = Inbox(self._handoff())
        timer.prompt(len(seq.prompt_ids))
        self.loop.submit(seq, lambda ev: inbox.push(time.perf_counter(), ev))
        text, ids, lps, n, sent, done = [], [], [], 0, 0.0, False
        self.streams += stream
        try:
            batch = await self._first(inbox) if stream else None
            if stream and batch is None:
                yield Started(len(seq.prompt_ids))
            while True:
                # a stream wakes at most once per interval, a non-streaming request only for its last event
                if batch is None:
                    batch = await inbox.take(sent + self._stream_interval() if stream else None)
                for _, ev in batch:
                    if isinstance(ev, ErrorEvent):
                        done = True
                        yield Failed(500, f"generation failed: {ev.message}", "internal_error", type="server_error")
                        return
                    n += 1
                    text.append(ev.text)
                    ids.append(ev.token_id)
                    if ev.logprob is not None:
                        lps.append(prepare.logprob_entry(self.engine.tokenizer, ev))
                timer.tokens([at for at, _ in batch], seq.admitted_at)
                final, batch = batch[-1][1], None
                if final.final:  # the tail rides on Finished: one message, not two
                    done = True
                    yield Finished(final.finish_reason, len(seq.prompt_ids), n, "".join(text), tuple(lps))
                    return
                if stream and ids:
                    yield Delta("".join(text), tuple(ids), tuple(lps))
                    text, ids, lps, sent = [], [], [], time.perf_counter()
        finally:  # the caller went away (cancelled, or stopped reading): free the slot at the next step
            self.streams -= stream
            if not done:
                self.loop.cancel(seq.seq_id)

    @staticmethod
    async def _first(inbox: Inbox) -> list | None:
        """A stream's first events, if they come within HEADERS_WITHIN_S; None: send `Started` first."""
        try:
            return await asyncio.wait_for(inbox.take(0.0), HEADERS_WITHIN_S)
        except TimeoutError:
            return None

    def _stream_interval(self) -> float:
        """Seconds between a stream's messages: stream_interval_ms, longer when the replica's streams together
        would send more than stream_messages_per_s."""
        return max(self.spec.stream_interval_ms / 1e3, self.streams / self.spec.stream_messages_per_s)

    def _handoff(self) -> Handoff:
        """The engine thread -> event loop hand-off, one per loop (one wake-up per step for all requests)."""
        loop = asyncio.get_running_loop()
        if getattr(self, "_handoff_", None) is None or self._handoff_.loop is not loop:
            self._handoff_ = Handoff(loop)
        return self._handoff_

    def __del__(self):
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.close(timeout=1.0)
            self.engine.close()
