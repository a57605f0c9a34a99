"""TEST DOUBLE for the Neuron SDK: fake `torch_neuronx` and `neuronx_distributed` modules that record
every call the Neuron backend makes, so its contract is checked without Neuron hardware or packages.

`install()` puts them in sys.modules. Traced graphs are not compiled: the double keeps the module that
ModelBuilder was given and, when the "device" model is called, runs that module on the CPU (its
registered KV buffers standing in for device state). Nothing here is, or pretends to be, Neuron.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

import torch

CALLS: list[tuple] = []
SAVED: dict[str, "FakeNxDModel"] = {}


class NxDParallelState:
    def __init__(self, world_size=1, rank=0, tensor_model_parallel_size=1, **kw):
        self.world_size, self.tp = world_size, tensor_model_parallel_size

    def __enter__(self):
        CALLS.append(("parallel_state", self.world_size, self.tp))
        return self

    def __exit__(self, *exc):
        return False


class ModelBuilder:
    def __init__(self, model, weights_to_skip_layout_optimization=None):
        self.model, self.traces = model, {}
        CALLS.append(("ModelBuilder", type(model).__name__))

    def trace(self, args=None, kwargs=None, tag=None, spmd=True):
        assert kwargs is None and isinstance(args, tuple), "inputs must be positional"
        before = {n: getattr(self.model, n) for n in self.model.kv_names}
        with torch.no_grad():
            out = self.model(*args)
        replaced = all(getattr(self.model, n) is not before[n] for n in before)
        self.traces[tag] = [(tuple(a.shape), a.dtype) for a in args]
        CALLS.append(("trace", tag, self.traces[tag], tuple(out.shape), replaced))
        return self

    def compile(self, priority_model_key=None, compiler_workdir=None, compiler_args=None, max_workers=None):
        CALLS.append(("compile", dict(compiler_args), compiler_workdir))
        return FakeNxDModel(self.model, self.traces)


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
        self.weights = per_rank
        CALLS.append(("set_weights", len(per_rank)))
        state = dict(per_rank[0])
        state.update({n: torch.zeros_like(getattr(self.module, n)) for n in self.module.kv_names})
        self.module.load_state_dict(state, strict=True)  # the keys and shapes must be exactly the model's

    def to_neuron(self):
        self.on_device = True
        CALLS.append(("to_neuron",))

    def forward(self, *args, model_name=None, forward_mode="default"):
        assert self.on_device, "to_neuron() must come before forward"
        assert [(tuple(a.shape), a.dtype) for a in args] == self.traces[model_name], f"inputs differ from {model_name}"
        CALLS.append(("forward", model_name))
        with torch.no_grad():
            return self.module(*args)


def _identity(x):
    return x


@contextmanager
def installed():
    """The fake SDK in sys.modules for the duration; CALLS cleared on entry."""
    CALLS.clear()
    tnx = types.ModuleType("torch_neuronx")
    tnx.__doc__ = "TEST DOUBLE"
    nxd = types.ModuleType("neuronx_distributed")
    nxd.__doc__ = "TEST DOUBLE"
    nxd.ModelBuilder, nxd.NxDModel, nxd.NxDParallelState = ModelBuilder, FakeNxDModel, NxDParallelState
    pl = types.ModuleType("neuronx_distributed.parallel_layers")
    mappings = types.ModuleType("neuronx_distributed.parallel_layers.mappings")
    mappings.reduce_from_tensor_model_parallel_region = _identity
    mappings.gather_from_tensor_model_parallel_region = _identity
    mods = {"torch_neuronx": tnx, "neuronx_distributed": nxd, "neuronx_distributed.parallel_layers": pl,
            "neuronx_distributed.parallel_layers.mappings": mappings}
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
