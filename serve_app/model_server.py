"""ModelServer: the Ray Serve deployment class, one deployment per configured model.

A replica pins its NeuronCores (Ray sets NEURON_RT_VISIBLE_CORES for the `neuron_cores` it asked for;
we check it is a contiguous set of exactly tp cores), builds its engine through an injected factory, and
runs the host side (tokenization, PLE lookup, the decode loop, detokenization, stop strings) itself.

`generate` is an async generator of event dicts. Each blocking engine step runs on the replica's single
engine thread, so a client that disconnects cancels the request at its next step: the engine generator
is then closed on that same thread, after the step in flight, and no more decode steps are spent on it.
Requests run one at a time (the engine holds one sequence's KV cache); others wait on a lock, counted by
Serve against `max_ongoing_requests`, beyond which `max_queued_requests` turns callers away with 503.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from neuron_workers.errors import UserError
from neuron_workers.params import SamplingParams
from serve_app.config import ModelSpec
from serve_app.metrics import ServerMetrics
from serve_app.stops import StopStrings

log = logging.getLogger("ray.serve")
_DONE = object()


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


def _next(it):
    return next(it, _DONE)


class ModelServer:
    def __init__(self, spec: dict):
        self.spec = ModelSpec(**spec)
        self.cores = check_visible_cores(self.spec)
        self.engine = import_attr(self.spec.engine)(self.spec)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"engine-{self.spec.name}")
        self.lock = asyncio.Lock()
        self.stats = {"requests": 0, "completed": 0, "cancelled": 0, "decode_steps": 0, "active": 0}
        self.metrics = ServerMetrics(self.spec.name)
        log.info("model %s ready (backend %s, tp %d, cores %s, context %d)", self.spec.name, self.spec.backend,
                 self.spec.tp, self.cores, self.engine.max_context)

    async def ready(self) -> dict:
        return {"name": self.spec.name, "max_context": self.engine.max_context, "cores": self.cores}

    async def get_stats(self) -> dict:
        return dict(self.stats)

    def _prepare(self, req: dict) -> tuple[list[int], SamplingParams, list[str]]:
        eng = self.engine
        if req["kind"] == "chat":
            ids = eng.encode_chat(req["messages"])
        elif isinstance(req["prompt"], str):
            ids = eng.encode(req["prompt"])
        else:
            ids = list(req["prompt"])
        max_tokens = req.get("max_tokens") or max(eng.max_context - len(ids), 1)
        eng.validate(ids, max_tokens)
        sampling = {**eng.sampling_defaults, **req.get("sampling", {})}
        params = SamplingParams(max_new_tokens=max_tokens, ignore_eos=bool(req.get("ignore_eos")), **sampling)
        return ids, params, list(req.get("stop") or [])

    async def generate(self, req: dict):
        """Events: start (prompt_tokens) | error | delta (text, token_ids) ... | end (finish_reason, usage)."""
        self.stats["requests"] += 1
        try:
            ids, params, stops = self._prepare(req)
        except UserError as e:
            self.metrics.finish("error")
            yield {"type": "error", "status": 400, "message": str(e), "code": e.code, "param": e.param}
            return
        timer = self.metrics.request(len(ids))
        yield {"type": "start", "prompt_tokens": len(ids)}
        async with self.lock:
            timer.started()
            async for event in self._run(ids, params, StopStrings(stops), timer):
                yield event

    async def _run(self, ids, params, stops: StopStrings, timer):
        loop = asyncio.get_running_loop()
        it = self.engine.generate(ids, params)
        n, finish = 0, None
        self.stats["active"] += 1
        try:
            while finish is None:
                ev = await loop.run_in_executor(self.pool, _next, it)
                if ev is _DONE:
                    break
                n += 1
                self.stats["decode_steps"] += 1
                timer.token()
                text = stops.feed(ev.text)
                finish = "stop" if stops.hit else ev.finish_reason
                if finish and not stops.hit:
                    text += stops.flush()
                yield {"type": "delta", "text": text, "token_ids": [ev.token_id]}
            self.stats["completed"] += 1
            self.metrics.finish(finish or "stop")
            yield {"type": "end", "finish_reason": finish or "stop", "prompt_tokens": len(ids),
                   "completion_tokens": n}
        except asyncio.CancelledError:
            self.stats["cancelled"] += 1
            self.metrics.finish("abort")
            raise
        except UserError as e:
            self.metrics.finish("error")
            yield {"type": "error", "status": 400, "message": str(e), "code": e.code, "param": e.param}
        finally:
            self.stats["active"] -= 1
            self.pool.submit(it.close)  # runs after the step in flight, on the engine thread
