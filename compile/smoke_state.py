"""`compile smoke`'s measuring steps (WRITTEN AGAINST THE SDK, NOT RUN ON HARDWARE HERE; tests/compile/test_smoke.py
runs them against the Neuron test double, which times the CPU).

  state    does a graph that keeps a state buffer unchanged copy it? The draft graph writes no KV but must return
           every buffer as state (`graph_model._draft`: an unchanged `.clone()`); NxD Inference never has such a
           graph, and whether the runtime aliases it or copies every buffer each step is not in public source.
           One ModelBuilder model with a state buffer of STATE_MIB (a KV layer's size at E2B, B = 32, context
           4096) and three graphs: `passthrough` (the clone, as the draft graph), `rmw1` (one entry rewritten with
           its own value: the fallback, GEMMA4_DRAFT_STATE=rmw) and `copy` (every element rewritten: what a copy
           costs); each timed (median of TIMED_CALLS). The decision: the clone is aliased when it costs no more
           than the one-entry write plus a quarter of the gap to the full copy; else build with
           GEMMA4_DRAFT_STATE=rmw (or fold the first draft into `decode_h`: not built).
  topkt    the tiled top-K (`model.tiled_topk` with the SDK's TopK per tile, fp32 tiles) at the decode shape
           [32, 262144], a tp=2 rank's shard [32, 131072] and the verify shape [32 x 5, 262144] (k = 4 drafts):
           one model, three graphs, each timed.
"""

from __future__ import annotations

import statistics
import tempfile
import time

STATE_MIB = 256
TIMED_CALLS = 10
TOPK_SHAPES = {"decode": (32, 262144), "tp2_shard": (32, 131072), "verify": (32 * 5, 262144)}
FLAGS = "--model-type=transformer --auto-cast=none --target inf2 -O2"


def timed(call, n: int = TIMED_CALLS) -> float:
    """Median seconds of `n` calls (after one warm-up)."""
    call()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def decide(passthrough: float, rmw1: float, copy: float) -> str:
    """The read-only-state decision from the three medians (seconds)."""
    if passthrough <= rmw1 + 0.25 * max(copy - rmw1, 0.0):
        return "aliased: the clone copies nothing (keep GEMMA4_DRAFT_STATE=clone)"
    return "COPIES: an unchanged clone costs a copy; build with GEMMA4_DRAFT_STATE=rmw"


def state_step() -> tuple[bool, str]:
    import torch
    from torch import nn

    from neuron_workers.backends.neuron import require_neuron

    _, nxd = require_neuron()
    rows = STATE_MIB * 2**20 // (2 * 256)

    class State(nn.Module):
        """The graph is picked by the input's length (a static shape, so every trace keeps its own)."""

        def __init__(self):
            super().__init__()
            self.register_buffer("kv", torch.zeros(rows, 256, dtype=torch.bfloat16))
            self.kv_names = ["kv"]

        def forward(self, x):
            first = self.kv[:1]
            if x.shape[0] == 1:  # passthrough: the draft graph's unchanged clone
                self.kv = self.kv.clone()
            elif x.shape[0] == 2:  # rmw1: one entry rewritten with its own value
                self.kv = self.kv.index_copy(0, torch.zeros(1, dtype=torch.int64), first)
            else:  # copy: every element rewritten
                self.kv = self.kv + x[:1].to(self.kv.dtype)
            return first.float().sum() + x

    modes = {"passthrough": torch.zeros(1), "rmw1": torch.zeros(2), "copy": torch.zeros(3)}
    with tempfile.TemporaryDirectory() as tmp, nxd.NxDParallelState(world_size=1, tensor_model_parallel_size=1,
                                                                     lnc_size=1):
        builder = nxd.ModelBuilder(State())
        for mode, x in modes.items():
            builder.trace(args=(x,), tag=mode)
        model = builder.compile(compiler_args=FLAGS, max_workers=1, compiler_workdir=tmp)
        model.set_weights([{}])
        model.to_neuron()
        t = {mode: timed(lambda x=x: model.forward(x)) for mode, x in modes.items()}
    ms = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in t.items())
    return True, f"state of {STATE_MIB} MiB: {ms}; decision: {decide(t['passthrough'], t['rmw1'], t['copy'])}"


def topk_times_step() -> tuple[bool, str]:
    import torch
    from torch import nn

    from neuron_workers.backends.neuron import require_neuron
    from neuron_workers.backends.neuron_build import neuron_topk
    from neuron_workers.model.tiled_topk import tiled_topk

    _, nxd = require_neuron()

    class TopKOnly(nn.Module):
        kv_names: list = []

        def forward(self, logits):
            return tiled_topk(logits, 256, neuron_topk)

    inputs = {tag: torch.randn(*shape).to(torch.bfloat16) for tag, shape in TOPK_SHAPES.items()}
    with tempfile.TemporaryDirectory() as tmp, nxd.NxDParallelState(world_size=1, tensor_model_parallel_size=1,
                                                                     lnc_size=1):
        builder = nxd.ModelBuilder(TopKOnly())
        for tag, x in inputs.items():
            builder.trace(args=(x,), tag=tag)
        model = builder.compile(compiler_args=FLAGS, max_workers=1, compiler_workdir=tmp)
        model.set_weights([{}])
        model.to_neuron()
        t = {tag: timed(lambda tag=tag: model.forward(inputs[tag])) for tag in inputs}
    return True, "top-256: " + ", ".join(f"{tag} {list(TOPK_SHAPES[tag])} {v * 1e3:.3f} ms" for tag, v in t.items())
