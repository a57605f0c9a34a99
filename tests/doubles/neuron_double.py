"""TEST DOUBLE for the Neuron SDK: fake `torch_neuronx` and `neuronx_distributed` modules that record
every call the Neuron backend makes and REJECT what the real SDK would reject or silently break on, so the
contract is checked without Neuron hardware or packages. Nothing here is, or pretends to be, Neuron.

Rules it enforces (each has a test showing it fails on the bad pattern, tests/test_neuron_double.py):
- state is linked by reads: every KV buffer a graph replaces must be read, and its new value must be a
  function of its old one (a write-only buffer is not aliased state on the device);
- a trace's weights are the tensors its forward reads (parameters and buffers, non-persistent ones
  included, tied ones once): `set_weights` must get exactly those names per rank;
- `compile` needs `max_workers` (unbounded, it runs one neuronx-cc per graph at once);
- forward is called with the traced inputs' shapes and dtypes, after `set_weights` and `to_neuron`.

`installed()` puts the fakes in sys.modules. Traced graphs are not compiled: the double keeps the module
ModelBuilder was given and runs it on the CPU (its registered KV buffers standing in for device state).
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from doubles.graph_facts import trace_facts

CALLS: list[tuple] = []
SAVED: dict[str, "FakeNxDModel"] = {}


class DoubleRejects(AssertionError):
    """What the real SDK would reject, or silently get wrong."""


class NxDParallelState:
    def __init__(self, world_size=1, rank=0, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                 context_parallel_size=1, expert_model_parallel_size=1, lnc_size=None):
        self.world_size, self.tp = world_size, tensor_model_parallel_size

    def __enter__(self):
        CALLS.append(("parallel_state", self.world_size, self.tp))
        return self

    def __exit__(self, *exc):
        return False


@dataclass
class MetaTensor:
    type: str
    checkpoint_key: bytes


@dataclass
class TraceArtifacts:
    weight_name_to_idx: dict[str, int]
    metaneff: types.SimpleNamespace
    inputs: list[tuple[tuple[int, ...], torch.dtype]]
    switches: dict = None  # module attributes the trace was taken under (the graph keeps them)


class ModelBuilder:
    def __init__(self, model, weights_to_skip_layout_optimization=None):
        self.model, self.trace_artifacts_collection = model, {}
        CALLS.append(("ModelBuilder", type(model).__name__))

    def trace(self, args=None, kwargs=None, tag=None, spmd=True):
        if kwargs is not None or not isinstance(args, tuple):
            raise DoubleRejects("inputs must be a tuple of positional tensors")
        uses, weights = trace_facts(self.model, args)
        for name, u in uses.items():
            if u.written and not (u.read and u.from_old):
                raise DoubleRejects(f"{tag}: buffer {name} is written without reading its old value: "
                                    f"it would not be linked as device state")
        state = [MetaTensor("INPUT_STATE", n.encode()) for n, u in uses.items() if u.read]
        inputs = [(tuple(a.shape), a.dtype) for a in args]
        # the module's own trace-time switches (e.g. which decode variant): the compiled graph keeps them
        switches = {"candidates": getattr(self.model, "candidates", None)}
        self.trace_artifacts_collection[tag] = TraceArtifacts(
            {w: i for i, w in enumerate(weights)}, types.SimpleNamespace(input_tensors=state), inputs,
            switches)
        CALLS.append(("trace", tag, inputs, {n: u.written for n, u in uses.items()}))
        return self

    def compile(self, priority_model_key=None, compiler_workdir=None, compiler_args=None, max_workers=None):
        if max_workers is None:
            raise DoubleRejects("compile() without max_workers runs one neuronx-cc per graph at once")
        if isinstance(compiler_args, dict) and set(compiler_args) != set(self.trace_artifacts_collection):
            raise DoubleRejects("compiler_args must name every traced graph")
        CALLS.append(("compile", dict(compiler_args), compiler_workdir, max_workers))
        return FakeNxDModel(self.model, self.trace_artifacts_collection)


class FakeNxDModel:
    def __init__(self, module, traces):
        self.module, self.traces, self.weights, self.on_device = module, traces, None, False

    def save(self, path, save_weights=False):
        SAVED[path] = self
        open(path, "w").write("test double: no NEFF here")
        CALLS.append(("save", path))

    @classmethod
    def load(cls, path, start_rank=None, local_ranks_size=None):
        CALLS.append(("load", path))
        return SAVED[path]

    def set_weights(self, per_rank):
        traced = set().union(*(t.weight_name_to_idx for t in self.traces.values()))
        for r, w in enumerate(per_rank):
            if set(w) != traced:
                raise DoubleRejects(f"rank {r} weights differ from the traced names: missing "
                                    f"{sorted(traced - set(w))[:4]}, unknown {sorted(set(w) - traced)[:4]}")
        self.weights = per_rank
        CALLS.append(("set_weights", len(per_rank)))
        state = {k: v.clone() for k, v in per_rank[0].items()}
        state.update({n: torch.zeros_like(getattr(self.module, n)) for n in self.module.kv_names})
        missing, unexpected = self.module.load_state_dict(state, strict=False)
        tied = {k for k in missing if k.endswith("lm_head.weight") or k.endswith("lm_head.embedding.weight")}
        if set(missing) - tied or unexpected:
            raise DoubleRejects(f"weights do not cover the module: missing {missing[:4]}, unexpected {unexpected[:4]}")

    def to_neuron(self):
        if self.weights is None:
            raise DoubleRejects("to_neuron() before set_weights()")
        self.on_device = True
        CALLS.append(("to_neuron",))

    def forward(self, *args, model_name=None, forward_mode="default"):
        if not self.on_device:
            raise DoubleRejects("to_neuron() must come before forward")
        if [(tuple(a.shape), a.dtype) for a in args] != self.traces[model_name].inputs:
            raise DoubleRejects(f"inputs differ from the traced {model_name}")
        CALLS.append(("forward", model_name))
        for name, value in (self.traces[model_name].switches or {}).items():
            if value is not None:
                setattr(self.module, name, value)
        with torch.no_grad():
            return self.module(*args)


def _identity(x):
    return x


class TopK:
    """torch_neuronx.xla_impl.ops.TopK as NxD calls it (`TopK.apply(tensor, k, dim=dim)` -> values, indices).
    Equal values come back in reverse id order, so the host's own tie rule is what the tests see."""

    @staticmethod
    def apply(tensor, k, dim=-1):
        values, idx = torch.topk(tensor.flip(dim), k, dim=dim)
        return values, tensor.shape[dim] - 1 - idx


@contextmanager
def installed():
    """The fake SDK in sys.modules for the duration; CALLS cleared on entry."""
    CALLS.clear()
    tnx = types.ModuleType("torch_neuronx")
    tnx.__doc__ = "TEST DOUBLE"
    tnx.__version__ = "2.9.0.2.15.32035"
    nxd = types.ModuleType("neuronx_distributed")
    nxd.__doc__ = "TEST DOUBLE"
    nxd.ModelBuilder, nxd.NxDModel, nxd.NxDParallelState = ModelBuilder, FakeNxDModel, NxDParallelState
    pl = types.ModuleType("neuronx_distributed.parallel_layers")
    mappings = types.ModuleType("neuronx_distributed.parallel_layers.mappings")
    mappings.reduce_from_tensor_model_parallel_region = _identity
    mappings.gather_from_tensor_model_parallel_region = _identity
    xla_impl = types.ModuleType("torch_neuronx.xla_impl")
    ops = types.ModuleType("torch_neuronx.xla_impl.ops")
    ops.TopK = TopK
    mods = {"torch_neuronx": tnx, "neuronx_distributed": nxd, "neuronx_distributed.parallel_layers": pl,
            "neuronx_distributed.parallel_layers.mappings": mappings, "torch_neuronx.xla_impl": xla_impl,
            "torch_neuronx.xla_impl.ops": ops}
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield CALLS
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
