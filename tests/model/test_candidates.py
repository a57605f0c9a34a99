"""The two decode graphs: `decode` returns each row's top-K logits and ids (what the engine runs when no
row needs the whole distribution), `decode_logits` the full logits; same inputs, same KV, same tokens."""

from __future__ import annotations

import torch

from neuron_workers.backends.cpu import CpuBackend
from neuron_workers.engine.engine import Engine
from neuron_workers.engine.params import SamplingParams
from neuron_workers.model.graphs import build_graph
from neuron_workers.model.loader import load_model
from neuron_workers.model.spec import DECODE, DECODE_LOGITS, decode_candidates, make_spec


def test_candidates_are_the_top_k_of_the_logits_graph(tiny_dirs):
    model = load_model(tiny_dirs["gemma4-e2b-tiny"])
    k = decode_candidates(model.dims)
    top = make_spec(model.dims, DECODE, 3, 1, 32, candidates=k)
    full = make_spec(model.dims, DECODE, 3, 1, 32)
    assert (top.tag, full.tag) == (DECODE, DECODE_LOGITS) and top.inputs == full.inputs
    assert [o.name for o in top.outputs][:2] == ["candidate_values", "candidate_ids"] and top.num_heads == 2
    inputs = list(full.example_inputs())
    inputs[0] = torch.tensor([[5], [17], [300]])
    with torch.no_grad():
        a = build_graph(model.hf_lm, model.dims, top)(*inputs)
        b = build_graph(model.hf_lm, model.dims, full)(*inputs)
    assert [(tuple(t.shape), t.dtype) for t in a] == [(o.shape, o.dtype) for o in top.outputs]
    values, ids = a[0], a[1]
    assert torch.equal(values, b[0].topk(k, dim=1).values) and torch.equal(b[0].gather(1, ids), values)
    assert all(torch.equal(x, y) for x, y in zip(a[2:], b[1:]))  # the same KV written


class NoCandidates(CpuBackend):
    """The same backend with the top-K graph switched off: every step returns full logits."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.candidates = 0


def run(model, backend, params: list[SamplingParams]) -> list[list[int]]:
    eng = Engine(model, backend)
    seqs = [eng.new_sequence([2, 9 + i, 40, 41], p) for i, p in enumerate(params)]
    out = {s.seq_id: [] for s in seqs}
    for ev in eng.run_all(seqs):
        out[ev.seq_id].append(ev.token_id)
    return list(out.values())


def test_engine_picks_the_graph_per_step_and_tokens_do_not_change(tiny_dirs):
    model = load_model(tiny_dirs["gemma4-e2b-tiny"])
    args = (model.hf_lm, model.dims, 64, (16,))
    plain = [SamplingParams(max_tokens=12, ignore_eos=True),
             SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, top_k=64, top_p=0.95, seed=3)]
    with_full = plain + [SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=5)]  # no top-k
    top = CpuBackend(*args, max_batch=3)
    assert run(model, top, plain) == run(model, NoCandidates(*args, max_batch=3), plain)
    assert DECODE in top._graphs and DECODE_LOGITS not in top._graphs  # no row needed the logits
    mixed = CpuBackend(*args, max_batch=3)
    assert run(model, mixed, with_full) == run(model, NoCandidates(*args, max_batch=3), with_full)
    assert DECODE_LOGITS in mixed._graphs  # the row without top-k made its steps return the logits


def test_plan_counts_the_bytes_the_decode_graphs_return():
    """`compile plan`'s device -> host bytes per step are the declared outputs' bytes (bf16 values, int32 ids)."""
    from compile.plan import decode_output_bytes, load_text_config
    from neuron_workers.model.dims import ModelDims

    from conftest import CONFIGS

    dims = ModelDims.from_hf(load_text_config(CONFIGS / "gemma-4-E2B.text_config.json"))
    specs = [make_spec(dims, DECODE, 32, 1, 4096, torch.bfloat16, torch.int32, candidates=k)
             for k in (decode_candidates(dims), 0)]
    nbytes = [sum(torch.empty((), dtype=t.dtype).element_size() * torch.Size(t.shape).numel()
                  for t in s.outputs[: s.num_heads]) for s in specs]
    assert tuple(nbytes) == decode_output_bytes(dims, 32) == (32 * 256 * 6, 32 * 262_144 * 2)
