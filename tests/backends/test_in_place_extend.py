"""The extend graphs over every slot (the verify graph of speculative decoding) read the KV buffers in place.

Exported as the Neuron build traces them (`graph_model`, the verify shape: B rows, T = k + 1, every position's
top-K), no op gathers a KV buffer by slot (no `index_select` / `gather` / `index` takes a tensor of a KV buffer's
shape: each layer attends over its buffers as written), where the graph that gathers them (`in_place = False`, the
check's own control) does; and both give the same candidates, hidden states and KV, for rows in any order, idle
slots and short rows included, on the three structures, in float64.
"""

from __future__ import annotations

import pytest
import torch

from neuron_workers.model.extend_inputs import extend_inputs
from neuron_workers.model.graph_model import ID_DTYPE, graph_model
from neuron_workers.model.loader import load_model
from neuron_workers.model.spec import EXTEND, decode_candidates, make_spec

from conftest import NAMES

B, CTX, T = 3, 32, 4
GATHERS = {"aten.index_select.default", "aten.gather.default", "aten.index.Tensor"}


class _Heads(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *args):
        head = self.m(*args)
        return (*head, *(getattr(self.m, n) for n in self.m.kv_names))


def verify_module(name, tiny_dirs, hidden=True, dtype=torch.float32, t=T):
    m = load_model(tiny_dirs[name], dtype)
    module = graph_model(m.hf_lm, m.dims, CTX, B, dtype)
    module.candidates, module.per_position, module.hidden = decode_candidates(m.dims), True, hidden
    spec = make_spec(m.dims, EXTEND, B, t, CTX, dtype, ID_DTYPE, None, module.candidates, B, True, hidden)
    return m, module, spec


def slot_gathers(module, args) -> list[str]:
    """The gather-like ops of the exported graph that take a tensor shaped as a KV buffer."""
    shapes = {tuple(getattr(module, n).shape) for n in module.kv_names}
    with torch.no_grad():
        ep = torch.export.export(_Heads(module), args, strict=False)
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function" and str(n.target) in GATHERS
            and tuple(n.args[0].meta["val"].shape) in shapes]


@pytest.mark.parametrize("name", NAMES)
def test_the_verify_graph_reads_the_kv_buffers_in_place(name, tiny_dirs):
    m, module, spec = verify_module(name, tiny_dirs)
    rows = [(2, [5, 6, 7, 8], 9), (0, [9, 10], 12)]
    args = extend_inputs(spec, rows, m.ple, m.dims.sliding_window)
    assert slot_gathers(module, args) == []
    module.in_place = False
    assert len(slot_gathers(module, args)) >= 2 * len(m.dims.kv_layers)  # the control: every buffer gathered


@pytest.mark.parametrize("name,t", [(n, T) for n in NAMES] + [("gemma4-e4b-tiny", 8)])  # 8: the tiny rings' slack
def test_in_place_equals_the_gathering_graph(name, t, tiny_dirs, monkeypatch):
    softmax = torch.softmax  # the attention kernel's fp32 softmax, in float64 here: the two graphs' rows differ
    monkeypatch.setattr(torch, "softmax", lambda x, dim, dtype=None: softmax(x, dim))  # in length, not in math
    m, module, spec = verify_module(name, tiny_dirs, dtype=torch.float64, t=t)
    gen = torch.Generator().manual_seed(0)
    kv0 = {n: torch.randn(getattr(module, n).shape, generator=gen, dtype=torch.float64) for n in module.kv_names}
    ring = m.dims.ring_size(CTX)
    ids = lambda first: list(range(first, first + t))  # noqa: E731
    cases = [[(2, ids(5), 9), (0, [9, 10], 12)],  # rows out of slot order, a short row, an idle slot
             [(1, ids(3), ring + 5), (2, ids(7), 2 * ring - 2 - t), (0, [11], 1)]]  # wrapped rings
    for rows in cases:
        args = extend_inputs(spec, rows, m.ple, m.dims.sliding_window)
        got = {}
        for in_place in (True, False):
            module.in_place = in_place
            for n, t in kv0.items():
                setattr(module, n, t.clone())
            with torch.no_grad():
                out = module(*args)
            got[in_place] = (out, [getattr(module, n) for n in module.kv_names])
        (a, kv_a), (b, kv_b) = got[True], got[False]
        for r, (_, ids, _) in enumerate(rows):  # what the engine reads: each row's real positions
            n = len(ids)
            torch.testing.assert_close(a[0][r, :n], b[0][r, :n], rtol=1e-10, atol=1e-10)
            assert torch.equal(a[1][r, :n], b[1][r, :n])
            torch.testing.assert_close(a[2][r, :n], b[2][r, :n], rtol=1e-10, atol=1e-10)
        idle = sorted(set(range(B)) - {slot for slot, _, _ in rows})
        for x, y, n in zip(kv_a, kv_b, module.kv_names):  # the same writes
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)
            assert torch.equal(x[idle], kv0[n][idle])  # an idle slot's buffers untouched


def test_in_place_up_to_the_rings_slack_only(tiny_dirs):
    """T <= the ring's slack runs in place; T = slack + 1 (the verify of k = slack drafts) gathers: in place it
    differed from the gathering graph in float64 (the chunk's last key overwrites the window's oldest ring entry)."""
    from neuron_workers.model.in_place import in_place_ok

    m = load_model(tiny_dirs["gemma4-e4b-tiny"], torch.float32, with_weights=False)
    ring, slack = m.dims.ring_size(CTX), m.dims.ring_slack
    assert in_place_ok(m.dims, B, B, slack, ring) and not in_place_ok(m.dims, B, B, slack + 1, ring)
    assert not in_place_ok(m.dims, B, B - 1, 2, ring)  # not every slot: the gathering graph
