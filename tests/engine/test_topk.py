"""Argmax / top-k without an fp32 copy of the vocabulary: the bf16 chunk view and the graph's top-K
candidates answer exactly as torch does on the fp32 copy, and a row samples the same token from either."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.sampling import Row, make_generator, needs_logits, sample_rows
from neuron_workers.engine.topk import Chunked, TopCandidates, canonical
from neuron_workers.model.spec import Candidates

VOCAB = 262_144


def awkward_logits(rows=6, seed=0) -> torch.Tensor:
    """bf16 logits with ties at the top, an all-negative row, and +0 / -0 as a row's largest values."""
    z = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    z[1, [7, 70_000, 200_000]] = 9.0  # a three-way tie for the max: the first index wins
    z[2] = z[2] * 3 - 20  # every value negative: the int16 patterns order backwards
    z[2, 123_456] = -0.5
    z[3] = -z[3].abs()
    z[3, 5000], z[3, 4000] = 0.0, -0.0  # -0 == +0: the first index (4000) wins
    return z


def test_chunked_bf16_argmax_equals_torch_on_fp32():
    z = awkward_logits()
    idx = torch.arange(z.shape[0])
    got = Chunked(z).argmax(idx)
    assert torch.equal(got, z.float().argmax(dim=1))
    assert got[1] == 7 and got[2] == 123_456 and got[3] == 4000


@pytest.mark.parametrize("k", [1, 8, 64, 200])
def test_topk_order_is_canonical_in_both_views(k):
    """Values best first, equal values by increasing id, lowest ids kept at a tie on the k-th value."""
    z = awkward_logits(seed=1)
    idx = torch.tensor([0, 1, 2, 3, 5])
    f = z.float()[idx]
    vals, ids = Chunked(z).topk(idx, k)
    full_v, full_i = f.sort(dim=1, descending=True, stable=True)  # stable: equal values by increasing id
    assert torch.equal(vals, full_v[:, :k]) and torch.equal(ids, full_i[:, :k])
    # the graph's candidates, in whatever order its top-k put equal values: same answer
    cand_v, cand_i = z.topk(256, dim=1)
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(k))
    view = TopCandidates(Candidates(cand_v[:, perm], cand_i[:, perm].int()))
    assert torch.equal(view.argmax(idx), f.argmax(dim=1))
    cv, ci = view.topk(idx, k)
    assert torch.equal(cv, vals) and torch.equal(ci, ids)


def test_canonical_sorts_ties_by_id():
    v, i = canonical(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), torch.tensor([[9, 8, 2, 5]]), 3)
    assert v.tolist() == [[3.0, 3.0, 2.0]] and i.tolist() == [[2, 8, 5]]


def test_a_row_samples_the_same_token_from_logits_or_candidates():
    """Greedy and top-k rows, each with its own seed: the `decode` graph's candidates and the full logits
    of `decode_logits` give identical tokens, so a row does not depend on which graph its step used."""
    z = awkward_logits(rows=5, seed=2)
    cand = Candidates(*z.topk(256, dim=1))
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_k=64, top_p=0.95, seed=1),
              SamplingParams(temperature=0.7, top_k=64, top_p=0.5, seed=2), SamplingParams(),
              SamplingParams(temperature=1.3, top_k=8, seed=4)]
    for trial in range(4):
        picks = []
        for scores in (z, cand):
            rows = [Row(r, p, None if p.greedy else make_generator(p.seed + trial)) for r, p in enumerate(params)]
            picks.append([s.token for s in sample_rows(scores, rows, 30.0)])
        assert picks[0] == picks[1]
        assert picks[0][1] != -1 and picks[0][3] == int(z[3].float().argmax())


def test_which_rows_need_the_logits():
    k = 256
    assert not needs_logits(Row(0, SamplingParams(), None), k)
    assert not needs_logits(Row(0, SamplingParams(temperature=1.0, top_k=64), None), k)
    assert needs_logits(Row(0, SamplingParams(temperature=1.0), None), k)  # no top-k: the whole vocabulary
    assert needs_logits(Row(0, SamplingParams(temperature=1.0, top_k=250), None), k)  # no margin left
    assert needs_logits(Row(0, SamplingParams(), None, logprobs=2), k)
    assert needs_logits(Row(0, SamplingParams(), None, torch.zeros(8192, dtype=torch.int32)), k)
    z = awkward_logits(rows=4)
    rows = [Row(0, SamplingParams(), None), Row(1, SamplingParams(temperature=1.0), make_generator(0))]
    got = sample_rows(Candidates(*z.topk(256, dim=1)), rows, 30.0)
    assert got[0].token == int(z[0].float().argmax()) and got[1].error  # never a silent wrong sample
