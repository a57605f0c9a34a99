"""TEST DOUBLE for the Neuron SDK: fake `torch_neuronx` and `neuronx_distributed` modules that record
every call the Neuron backend makes and REJECT what the real SDK would reject or silently break on, so the
contract is checked without Neuron hardware or packages. Nothing here is, or pretends to be, Neuron.

Rules it enforces (each has a test showing it fails on the bad pattern, tests/backends/test_neuron_rules.py),
as the NxD 0.18 source and torch-xla's documentation describe the real ones:
- state is what a graph re-assigns: every KV buffer a graph replaces must be read, and its new value must be
  a function of its old one (a write-only buffer is not aliased state on the device); a buffer the graph
  only reads is a weight, not state;
- a trace's weights are the tensors its forward reads (parameters and buffers, non-persistent ones
  included), keyed in `weight_name_to_idx` with `->` between module names (`'query->weight'`, as NxD's
  ModelBuilder V2 test shows); a Parameter shared by two modules is two weights (torch-xla: a tie made
  before the move to the device becomes two copies), a module reached by two paths is one;
- `set_weights` takes dotted state-dict names and must get exactly the traced weights per rank;
- `compile` needs `max_workers` (unbounded, it runs one neuronx-cc per graph at once);
- forward routes by the inputs' names (the traced forward's signature) and shapes, not dtypes, as
  NxDModel's router: unknown shapes are refused, an ambiguous route needs `model_name`; and it runs with the
  traced dtypes, after `set_weights` and `to_neuron`.

`installed()` puts the fakes in sys.modules. Traced graphs are not compiled: the double keeps the module
ModelBuilder was given and runs it on the CPU (its registered KV buffers standing in for device state).
"""

from __future__ import annotations

import inspect
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
        state = [MetaTensor("INPUT_STATE", n.encode()) for n, u in uses.items() if u.written]
        weights += [n for n, u in uses.items() if u.read and not u.written]  # read-only: a weight
        weights = device_copies(self.model, weights)
        inputs = [(tuple(a.shape), a.dtype) for a in args]
        # the module's own trace-time switches (e.g. which decode variant): the compiled graph keeps them
        switches = {"candidates": getattr(self.model, "candidates", None)}
        self.trace_artifacts_collection[tag] = TraceArtifacts(
            {w.replace(".", "->"): i for i, w in enumerate(weights)}, types.SimpleNamespace(input_tensors=state),
            inputs, switches)
        CALLS.append(("trace", tag, inputs, {n: u.written for n, u in uses.items()}))
        return self

    def compile(self, priority_model_key=None, compiler_workdir=None, compiler_args=None, max_workers=None):
        if max_workers is None:
            raise DoubleRejects("compile() without max_workers runs one neuronx-cc per graph at once")
        if isinstance(compiler_args, dict) and set(compiler_args) != set(self.trace_artifacts_collection):
            raise DoubleRejects("compiler_args must name every traced graph")
        flags = dict(compiler_args) if isinstance(compiler_args, dict) else compiler_args  # a str: every graph
        CALLS.append(("compile", flags, compiler_workdir, max_workers))
        return FakeNxDModel(self.model, self.trace_artifacts_collection)


class FakeNxDModel:
    def __init__(self, module, traces):
        self.module, self.traces, self.weights, self.on_device = module, traces, None, False
        names = list(inspect.signature(module.forward).parameters)
        self.routes: dict[str, list[str]] = {}
        for tag, t in traces.items():
            self.routes.setdefault(route_key(names, [s for s, _ in t.inputs]), []).append(tag)
        self.arg_names = names

    def save(self, path, save_weights=False):
        SAVED[path] = self
        open(path, "w").write("test double: no NEFF here")
        CALLS.append(("save", path))

    @classmethod
    def load(cls, path, start_rank=None, local_ranks_size=None):
        CALLS.append(("load", path))
        return SAVED[path]

    def set_weights(self, per_rank):
        traced = set().union(*({k.replace("->", ".") for k in t.weight_name_to_idx} for t in self.traces.values()))
        for r, w in enumerate(per_rank):
            if set(w) != traced:
                raise DoubleRejects(f"rank {r} weights differ from the traced names: missing "
                                    f"{sorted(traced - set(w))[:4]}, unknown {sorted(set(w) - traced)[:4]}")
        self.weights = per_rank
        CALLS.append(("set_weights", len(per_rank)))
        state = {k: v.clone() for k, v in per_rank[0].items()}
        state.update({n: torch.zeros_like(getattr(self.module, n)) for n in self.module.kv_names})
        missing, unexpected = self.module.load_state_dict(state, strict=False)
        aliases = aliases_of(self.module)
        uncovered = [k for k in missing if not aliases.get(k, set()) & set(state)]
        if uncovered or unexpected:
            raise DoubleRejects(f"weights do not cover the module: missing {uncovered[:4]}, "
                                f"unexpected {unexpected[:4]}")

    def to_neuron(self):
        if self.weights is None:
            raise DoubleRejects("to_neuron() before set_weights()")
        self.on_device = True
        CALLS.append(("to_neuron",))

    def forward(self, *args, model_name=None, forward_mode="default"):
        if not self.on_device:
            raise DoubleRejects("to_neuron() must come before forward")
        tags = self.routes.get(route_key(self.arg_names, [tuple(a.shape) for a in args]))
        if not tags:
            raise DoubleRejects(f"no traced graph takes inputs of these names and shapes: "
                                f"{[tuple(a.shape) for a in args]}")
        if model_name is None and len(tags) > 1:
            raise DoubleRejects(f"inputs match {tags}: model_name is required")
        tag = model_name if model_name is not None else tags[0]
        if tag not in tags:
            raise DoubleRejects(f"model_name {tag!r} does not take these inputs (they route to {tags})")
        if [(tuple(a.shape), a.dtype) for a in args] != self.traces[tag].inputs:
            raise DoubleRejects(f"inputs differ from the traced {tag}")
        CALLS.append(("forward", tag))
        for name, value in (self.traces[tag].switches or {}).items():
            if value is not None:
                setattr(self.module, name, value)
        with torch.no_grad():
            return self.module(*args)


def route_key(names, shapes) -> str:
    """NxDModel's route key: '(name: [shape], ...)' over the arguments given, in signature order."""
    return "(" + ", ".join(f"{n}: {list(s)}" for n, s in zip(names, shapes)) + ")"


def device_copies(module, weights: list[str]) -> list[str]:
    """The weights as the device holds them: a tensor set on two different modules (a Parameter tie made
    before the move) is one weight per module; a module reached by two paths is one weight."""
    owners: dict[int, dict[int, str]] = {}  # tensor -> owning module -> its first name
    for prefix, m in module.named_modules(remove_duplicate=False):
        for tname, t in list(m._parameters.items()) + list(m._buffers.items()):
            if t is not None:
                owners.setdefault(id(t), {}).setdefault(id(m), f"{prefix}.{tname}" if prefix else tname)
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    out: list[str] = []
    for w in weights:
        names = owners[id(tensors[w])].values() if w in tensors else [w]
        out += [n for n in names if n not in out]
    return out


def aliases_of(module) -> dict[str, set[str]]:
    """State-dict name -> every other name of the same tensor object (a module reached by two paths)."""
    by_id: dict[int, set[str]] = {}
    for n, t in list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False)):
        by_id.setdefault(id(t), set()).add(n)
    return {n: names - {n} for names in by_id.values() for n in names}


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
