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
- `set_weights` takes one weights dict per rank of the NxDParallelState the graphs were traced under;
- a compiled graph returns the shapes it was traced with: a forward whose outputs differ is refused (the
  double runs the module eagerly, which could otherwise return what no compiled graph would);
- TopK (k, row width, dim) and the fundamental units (`trace.functions.compile`, `NxDModel.add`): see
  neuron_double_units.py;
- trace and forward take positional tensors and keyword tensors (NxD 0.19 `trace/functions.py`
  `_process_example_inputs`: a keyword must name a forward parameter not given positionally, and every
  parameter without a default must be given); the inputs are the given ones in signature order;
- forward routes by the inputs' names (the traced forward's signature) and shapes, not dtypes, as
  NxDModel's router: unknown shapes are refused, an ambiguous route needs `model_name`; and it runs with the
  traced dtypes, after `set_weights` and `to_neuron`;
- an element gather (`aten.gather`, `aten.take_along_dim` along its dim; `aten.take` over the flattened input)
  whose gathered dim has at most 10 x XLA_DENSE_GATHER_FACTOR elements (81,920 by default) is refused at trace
  unless the process set the factor to 0 first: torch-xla 2.9's `IsSparseGather` (data_ops.cpp) compares exactly
  that size, on a NEURON or TPU device, and lowers the gather as a dense one-hot compare / select / reduce when it
  is not larger (`refuse_dense_gathers`); "real width" is that size, not the index's nor the result's;
  `index.Tensor` / `index_select` lower to slice gathers and pass; `installed()` starts with the variable
  unset, as a fresh process;
- a graph keeps the module switches it was traced under (`candidates`, `per_position`, `hidden`, `mixed`: which
  decode or extend variant), as a compiled graph does.

`installed()` puts the fakes in sys.modules. Traced graphs are not compiled: the double keeps the module
ModelBuilder was given and runs it on the CPU (its registered KV buffers standing in for device state), with
torch.gather as the device computes it (`device_gather`: a CPU-kernel bug on int32 indices kept out).
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from neuron_workers.backends.neuron import DENSE_GATHER_VAR  # XLA_DENSE_GATHER_FACTOR, as the build sets it

from doubles import neuron_double_units as units
from doubles.graph_facts import export_facts, state_of, trace_facts  # noqa: F401 (trace_facts: the tests check it is ours)
from doubles.neuron_double_units import DoubleRejects, TopK, aliases_of, device_copies, route_key  # noqa: F401

CALLS: list[tuple] = []
SAVED: dict[str, "FakeNxDModel"] = {}
STATE = {"tp": 1}  # the world size of the NxDParallelState entered last


class NxDParallelState:
    def __init__(self, world_size=1, rank=0, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                 context_parallel_size=1, expert_model_parallel_size=1, lnc_size=None):
        self.world_size, self.tp = world_size, tensor_model_parallel_size

    def __enter__(self):
        CALLS.append(("parallel_state", self.world_size, self.tp))
        STATE["tp"] = self.world_size
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
    names: list = None  # the forward parameters given, in signature order
    switches: dict = None  # module attributes the trace was taken under (the graph keeps them)
    heads: list = None  # the graph's output shapes (before the state)
    module: object = None  # what the double runs in place of the NEFF
    hlo: object = None  # .SerializeToString(): the same bytes for the same trace
    tag: str = ""  # the trace's tag (the weight layout calls name it)
    gathers: list = None  # (op, gathered dim's size) of each element gather the trace holds (`gathered_dims`)


@dataclass
class FakeHlo:
    text: str

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        return self.text.encode()


def refuse_dense_gathers(tag, gathered: list[tuple[str, int]]) -> None:
    """Refuses a trace with an element gather (`graph_facts.gathered_dims`: op, gathered dim's size) that torch-xla
    2.9 would lower densely on a Neuron device. `IsSparseGather` (torch_xla/csrc/data_ops.cpp, v2.9.0), on a TPU or
    NEURON device: sparse iff `input_shape.dimensions()[dim] > 10 * XLA_DENSE_GATHER_FACTOR` (default 8,192), the
    index's shape not considered; else the gather is a one-hot compare / select / reduce over that dim. The factor
    is read once per process (a function-local static) at the first gather; 0 makes every non-empty gather sparse.
    At real width the ring write-back (18,432 rows on E2B) and the tiled top-K's ids are under 81,920: a trace
    whose process has not set 0 (`neuron.force_sparse_gathers`, which builds call first) is refused here, naming
    the tag, each op and its width. The threshold is compile.hlo's (`dense_on_neuron`)."""
    from compile.hlo import DEFAULT_DENSE_FACTOR, dense_on_neuron

    dense = [(op, n) for op, n in gathered if dense_on_neuron([n])]
    if dense:
        factor = int(os.environ.get(DENSE_GATHER_VAR, DEFAULT_DENSE_FACTOR))
        named = ", ".join(f"{op} over {n:,}" for op, n in sorted(set(dense), key=lambda g: (-g[1], g[0]))[:4])
        raise DoubleRejects(f"{tag}: {len(dense)} element gather(s) would lower densely on a Neuron device ({named} "
                            f"elements of the gathered dim <= 10 x {DENSE_GATHER_VAR} = {10 * factor:,}); "
                            f"a build sets {DENSE_GATHER_VAR}=0 first (neuron.force_sparse_gathers)")


class ModelBuilder:
    def __init__(self, model, weights_to_skip_layout_optimization=None):
        self.model, self.trace_artifacts_collection, self.world_size = model, {}, STATE["tp"]
        CALLS.append(("ModelBuilder", type(model).__name__))

    def trace(self, args=None, kwargs=None, tag=None, spmd=True):
        if not isinstance(args, tuple) or not isinstance(kwargs or {}, dict):
            raise DoubleRejects("inputs must be a tuple of positional tensors (and a dict of keyword tensors)")
        names, given = provided(self.model, args, kwargs or {})
        uses, weights, heads, gathered = export_facts(self.model, args, kwargs or {})
        refuse_dense_gathers(tag, gathered)
        for name, u in uses.items():
            if u.written and not (u.read and u.from_old):
                raise DoubleRejects(f"{tag}: buffer {name} is written without reading its old value: "
                                    f"it would not be linked as device state")
        state = [MetaTensor("INPUT_STATE", n.encode()) for n, u in uses.items() if u.written]
        weights += [n for n, u in uses.items() if u.read and not u.written]  # read-only: a weight
        weights = device_copies(self.model, weights)
        inputs = [(tuple(a.shape), a.dtype) for a in given]
        # the module's own trace-time switches (which decode or extend variant): the compiled graph keeps them
        switches = {n: getattr(self.model, n, None) for n in ("candidates", "per_position", "hidden", "mixed")}
        hlo = FakeHlo(repr((names, inputs, weights, sorted(uses), switches, heads)))
        self.trace_artifacts_collection[tag] = TraceArtifacts(
            {w.replace(".", "->"): i for i, w in enumerate(weights)}, types.SimpleNamespace(input_tensors=state),
            inputs, names, switches, heads, self.model, hlo, tag, gathered)
        CALLS.append(("trace", tag, inputs, {n: u.written for n, u in uses.items()}))
        return self

    def compile(self, priority_model_key=None, compiler_workdir=None, compiler_args=None, max_workers=None):
        if max_workers is None:
            raise DoubleRejects("compile() without max_workers runs one neuronx-cc per graph at once")
        if isinstance(compiler_args, dict) and set(compiler_args) != set(self.trace_artifacts_collection):
            raise DoubleRejects("compiler_args must name every traced graph")
        flags = dict(compiler_args) if isinstance(compiler_args, dict) else compiler_args  # a str: every graph
        CALLS.append(("compile", flags, compiler_workdir, max_workers))
        model = FakeNxDModel(world_size=self.world_size)
        for tag, art in self.trace_artifacts_collection.items():
            model.add(tag, art, units.CompilationArtifacts("test double: no NEFF"))
        return model


class FakeNxDModel:
    def __init__(self, world_size=1, layout_transformer=None):
        self.world_size, self.module, self.traces, self.weights, self.on_device = world_size, None, {}, None, False
        self.layout_transformer = layout_transformer
        self.routes: dict[str, list[str]] = {}
        self.arg_names: list[str] = []

    def add(self, key, trace_artifacts, compilation_artifacts):
        if self.module is not None and trace_artifacts.module is not self.module:
            raise DoubleRejects("every graph of one NxDModel must come from the module the state came from")
        self.module, self.traces[key] = trace_artifacts.module, trace_artifacts
        self.arg_names = list(inspect.signature(self.module.forward).parameters)
        names = trace_artifacts.names or self.arg_names
        self.routes.setdefault(route_key(names, [s for s, _ in trace_artifacts.inputs]), []).append(key)
        CALLS.append(("add", key))
        return self

    def save(self, path, save_weights=False):
        SAVED[path] = self
        open(path, "w").write("test double: no NEFF here")
        CALLS.append(("save", path))

    @classmethod
    def load(cls, path, start_rank=None, local_ranks_size=None):
        CALLS.append(("load", path))
        return SAVED[path]

    def set_weights(self, per_rank):
        if len(per_rank) != self.world_size:
            raise DoubleRejects(f"set_weights got {len(per_rank)} weight dicts for a world of {self.world_size} "
                                f"ranks: one per rank")
        traced = set().union(*({k.replace("->", ".") for k in t.weight_name_to_idx} for t in self.traces.values()))
        for r, w in enumerate(per_rank):
            if set(w) != traced:
                raise DoubleRejects(f"rank {r} weights differ from the traced names: missing "
                                    f"{sorted(traced - set(w))[:4]}, unknown {sorted(set(w) - traced)[:4]}")
        self.weights = per_rank
        CALLS.append(("set_weights", len(per_rank)))
        state = {k: v.clone() for k, v in per_rank[0].items()}
        state.update({n: torch.zeros_like(getattr(self.module, n)) for n in state_of(self.module)})
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

    def forward(self, *args, model_name=None, forward_mode="default", **kwargs):
        if not self.on_device:
            raise DoubleRejects("to_neuron() must come before forward")
        names, given = provided(self.module, args, kwargs)
        tags = self.routes.get(route_key(names, [tuple(a.shape) for a in given]))
        if not tags:
            raise DoubleRejects(f"no traced graph takes inputs of these names and shapes: "
                                f"{list(zip(names, [tuple(a.shape) for a in given]))}")
        if model_name is None and len(tags) > 1:
            raise DoubleRejects(f"inputs match {tags}: model_name is required")
        tag = model_name if model_name is not None else tags[0]
        if tag not in tags:
            raise DoubleRejects(f"model_name {tag!r} does not take these inputs (they route to {tags})")
        if [(tuple(a.shape), a.dtype) for a in given] != self.traces[tag].inputs:
            raise DoubleRejects(f"inputs differ from the traced {tag}")
        CALLS.append(("forward", tag))
        for name, value in (self.traces[tag].switches or {}).items():
            if value is not None:
                setattr(self.module, name, value)
        with torch.no_grad(), units.device_gather():
            out = self.module(*args, **kwargs)
        got = [tuple(t.shape) for t in (out if isinstance(out, tuple) else (out,))]
        if self.traces[tag].heads is not None and got != self.traces[tag].heads:
            raise DoubleRejects(f"{tag} returned shapes {got}, but the compiled graph returns the traced "
                                f"{self.traces[tag].heads}")
        return out


def provided(module, args: tuple, kwargs: dict) -> tuple[list[str], list]:
    """The forward parameters given (names, tensors), in signature order, as NxD orders them: the positional ones,
    then each keyword in signature order; a keyword that is no parameter or repeats a positional one, or a
    parameter without a default left out, is refused as NxD refuses it."""
    params = [p for p in inspect.signature(module.forward).parameters.values() if p.name != "self"]
    if len(args) > len(params):
        raise DoubleRejects(f"{len(args)} positional inputs for a forward of {len(params)} parameters")
    names = [p.name for p in params[: len(args)]]
    unknown = set(kwargs) - {p.name for p in params[len(args):]}
    if unknown:
        raise DoubleRejects(f"keyword inputs {sorted(unknown)} are not parameters left after the positional ones")
    missing = [p.name for p in params[len(args):] if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if missing:
        raise DoubleRejects(f"missing required parameters {missing}")
    later = [p.name for p in params[len(args):] if p.name in kwargs]
    return names + later, list(args) + [kwargs[n] for n in later]


def _identity(x):
    return x


def _gather_copies(x):
    """Gathers along the last dim into the world's shape (the double runs rank 0's program alone: the other
    ranks' parts are copies of its own, so shapes are right and values are not)."""
    return torch.cat([x] * STATE["tp"], dim=-1)


@contextmanager
def installed():
    """The fake SDK in sys.modules for the duration; CALLS cleared on entry."""
    CALLS.clear()
    units.COMPILED.clear()
    units.TOPK_CALLS.clear()
    units.WLO.clear()
    STATE["tp"] = 1
    tnx = types.ModuleType("torch_neuronx")
    tnx.__doc__ = "TEST DOUBLE"
    tnx.__version__ = "2.9.0.2.15.32035"
    nxd = types.ModuleType("neuronx_distributed")
    nxd.__doc__ = "TEST DOUBLE"
    nxd.ModelBuilder, nxd.NxDModel, nxd.NxDParallelState = ModelBuilder, FakeNxDModel, NxDParallelState
    pl = types.ModuleType("neuronx_distributed.parallel_layers")
    mappings = types.ModuleType("neuronx_distributed.parallel_layers.mappings")
    mappings.reduce_from_tensor_model_parallel_region = _identity
    mappings.gather_from_tensor_model_parallel_region = _gather_copies
    xla_impl = types.ModuleType("torch_neuronx.xla_impl")
    ops = types.ModuleType("torch_neuronx.xla_impl.ops")
    ops.TopK = TopK
    trace = types.ModuleType("neuronx_distributed.trace")
    functions = types.ModuleType("neuronx_distributed.trace.functions")
    functions.compile = units.compile
    functions.compile_wlo = units.compile_wlo
    functions.compile_layout_transformer = units.compile_layout_transformer
    hlo_utils = types.ModuleType("neuronx_distributed.trace.hlo_utils")
    hlo_utils.mark_weights_for_wlo = units.mark_weights_for_wlo
    hlo_utils.apply_layout_transformation = units.apply_layout_transformation
    trace.hlo_utils = hlo_utils
    mb_utils = types.ModuleType("neuronx_distributed.trace.model_builder_utils")
    mb_utils.CompilationArtifacts = units.CompilationArtifacts
    nxd_model = types.ModuleType("neuronx_distributed.trace.nxd_model")
    nxd_model.NxDModel = FakeNxDModel
    mods = {"neuronx_distributed.trace": trace, "neuronx_distributed.trace.functions": functions,
            "neuronx_distributed.trace.hlo_utils": hlo_utils,
            "neuronx_distributed.trace.model_builder_utils": mb_utils, "neuronx_distributed.trace.nxd_model": nxd_model,
            "torch_neuronx": tnx, "neuronx_distributed": nxd, "neuronx_distributed.parallel_layers": pl,
            "neuronx_distributed.parallel_layers.mappings": mappings, "torch_neuronx.xla_impl": xla_impl,
            "torch_neuronx.xla_impl.ops": ops}
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    dense_factor = os.environ.pop(DENSE_GATHER_VAR, None)  # a fresh process's: unset until a build sets it
    try:
        yield CALLS
    finally:
        os.environ.pop(DENSE_GATHER_VAR, None)
        if dense_factor is not None:
            os.environ[DENSE_GATHER_VAR] = dense_factor
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
