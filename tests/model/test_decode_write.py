"""The decode graph writes one position per row into each KV buffer (a scatter into the old buffer, as NxD
Inference's token-generation update), not a one-hot select over the whole [B, H, ctx, D] buffer; read off the
strict export of the decode graph. (The xla tier audits the lowered HLO the same way.)"""

from __future__ import annotations

import torch

from neuron_workers.backends.cpu import export_graph
from neuron_workers.model.graphs import build_graph
from neuron_workers.model.loader import load_model
from neuron_workers.model.spec import DECODE, make_spec


def test_decode_scatters_one_position_per_row(tiny_dirs):
    m = load_model(tiny_dirs["gemma4-12b-tiny"], torch.float32)
    spec = make_spec(m.dims, DECODE, 3, 1, 32, torch.float32)
    graph = export_graph(build_graph(m.hf_lm, m.dims, spec), spec).graph
    kv_shapes = [tuple(t.shape) for t in spec.kv_inputs]

    def shape(node):
        val = node.meta.get("val")
        return tuple(val.shape) if isinstance(val, torch.Tensor) else None

    calls = [n for n in graph.nodes if n.op == "call_function"]
    selects = [n for n in calls if "where" in str(n.target) and shape(n) in kv_shapes]
    scatters = [n for n in calls if "scatter" in str(n.target) and shape(n) in kv_shapes]
    assert selects == []
    assert sorted(shape(n) for n in scatters) == sorted(kv_shapes)
    for n in scatters:  # the new values: one position (dim 2) per row and head
        b, h, _, d = shape(n)
        assert tuple(shape(n.args[3])) == (b, h, 1, d) and n.args[1] == 2
