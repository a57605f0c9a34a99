"""GraphSpec declares the graphs' outputs as well as their inputs: what each graph returns matches it."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.model.graphs import build_graph
from neuron_workers.model.loader import load_model
from neuron_workers.model.spec import DECODE, PREFILL, make_spec

from conftest import NAMES


@pytest.mark.parametrize("name", NAMES)
def test_graph_outputs_match_the_declared_outputs(tiny_dirs, name):
    model = load_model(tiny_dirs[name])
    for phase, bucket in ((PREFILL, 16), (DECODE, 1)):
        spec = make_spec(model.dims, phase, 3, bucket, 32)
        with torch.no_grad():
            out = build_graph(model.hf_lm, model.dims, spec)(*spec.example_inputs())
        assert [o.name for o in spec.outputs][:2] == ["logits", spec.kv_inputs[0].name]
        assert [(tuple(t.shape), t.dtype) for t in out] == [(o.shape, o.dtype) for o in spec.outputs]
        assert spec.outputs[0].shape == (1 if phase == PREFILL else 3, model.dims.vocab_size)
