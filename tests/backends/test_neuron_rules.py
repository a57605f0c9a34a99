"""The rules the real Neuron SDK enforces, checked without it:
- on the module the Neuron build traces (`NeuronGraphModel`), in every graph (prefill buckets, a bucket of
  1 included, and batched decode), every KV buffer is read and replaced by a function of its old value;
- the strict test double rejects each bad pattern the real SDK would (write-only state, weight names that
  differ from the traced ones, compile without a worker bound), so the contract tests mean something;
- the build fails with the names when a trace takes weights we would not save or state that is not KV."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from neuron_workers.backends.neuron_build import check_traces
from neuron_workers.errors import UserError
from neuron_workers.model.graph_model import ID_DTYPE, graph_model, make_buffers_persistent
from neuron_workers.model.loader import load_model
from neuron_workers.model.spec import DECODE, PREFILL, make_spec

from conftest import NAMES
from doubles import neuron_double
from doubles.graph_facts import trace_facts


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_graph_reads_and_rewrites_every_kv_buffer(name, tiny_dirs):
    m = load_model(tiny_dirs[name], torch.bfloat16)
    make_buffers_persistent(m.hf_lm)
    module = graph_model(m.hf_lm, m.dims, 32, 3, torch.bfloat16)
    for phase, bucket in ((PREFILL, 1), (PREFILL, 16), (DECODE, 1)):
        spec = make_spec(m.dims, phase, 3, bucket, 32, torch.bfloat16, ID_DTYPE)
        uses, weights = trace_facts(module, tuple(t.zeros() for t in spec.host_inputs))
        assert set(uses) == set(module.kv_names) and len(uses) == 2 * len(m.dims.kv_layers)
        for buf, u in uses.items():
            assert u.read and u.written and u.from_old, (name, spec.tag, buf, u)
        assert not set(weights) & set(module.kv_names)
        assert set(weights) <= set(module.state_dict())  # after make_buffers_persistent: nothing unsaved


class Toy(nn.Module):
    """A one-buffer model whose update is chosen per test."""

    def __init__(self, update):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.register_buffer("k_0", torch.zeros(2, 4))
        self.kv_names, self.update = ["k_0"], update

    def forward(self, x):
        self.k_0 = self.update(self.k_0, x * self.w)
        return x.sum()


@pytest.mark.parametrize("update,ok", [
    (lambda old, new: torch.where(torch.tensor([[True], [False]]), new, old), True),  # read-modify-write
    (lambda old, new: torch.index_copy(old, 0, torch.tensor([0]), new[None]), True),
    (lambda old, new: new.expand(2, 4) * 1.0, False),  # write-only: the old value is never read
    (lambda old, new: torch.cat([new[None], new[None]]), False),  # a cat that drops the buffer
])
def test_double_rejects_write_only_state(update, ok):
    with neuron_double.installed():
        builder = neuron_double.ModelBuilder(Toy(update))
        if ok:
            builder.trace(args=(torch.ones(4),), tag="g")
            assert neuron_double.trace_facts is trace_facts
        else:
            with pytest.raises(neuron_double.DoubleRejects, match="without reading its old value"):
                builder.trace(args=(torch.ones(4),), tag="g")


def test_double_rejects_compile_without_workers_and_renamed_weights():
    with neuron_double.installed():
        builder = neuron_double.ModelBuilder(Toy(lambda old, new: old + new))
        builder.trace(args=(torch.ones(4),), tag="g")
        with pytest.raises(neuron_double.DoubleRejects, match="max_workers"):
            builder.compile(compiler_args={"g": "-O1"})
        model = builder.compile(compiler_args={"g": "-O1"}, max_workers=1)
        with pytest.raises(neuron_double.DoubleRejects, match="differ from the traced names"):
            model.set_weights([{"weight": torch.ones(4)}])
        model.set_weights([{"w": torch.full((4,), 2.0)}])
        model.to_neuron()
        assert float(model.forward(torch.ones(4), model_name="g")) == 4.0


def artifacts(weights, state):
    meta = types.SimpleNamespace(input_tensors=[types.SimpleNamespace(type="INPUT_STATE", checkpoint_key=s.encode())
                                                for s in state])
    return types.SimpleNamespace(weight_name_to_idx={w: i for i, w in enumerate(weights)}, metaneff=meta)


def test_build_check_names_what_does_not_match():
    kv = {"k_0", "v_0"}
    assert check_traces({"decode": artifacts(["a", "b"], kv)}, {"a", "b", "c"}, kv) == {"a", "b"}
    with pytest.raises(UserError, match=r"graph prefill_16 takes weights we would not save: \['rope.inv_freq'\]"):
        check_traces({"prefill_16": artifacts(["a", "rope.inv_freq"], kv)}, {"a"}, kv)
    with pytest.raises(UserError, match=r"its device state is not exactly the KV buffers \(missing \['v_0'\]"):
        check_traces({"decode": artifacts(["a"], {"k_0"})}, {"a"}, kv)
