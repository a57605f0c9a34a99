"""Grammar masks in `distribution.sample_full_row`: sparse and dense masks, greedy and sampled rows, give
the token a plain reference (mask after the soft-cap, then the row's own draw) gives, and never a masked one."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.engine.distribution import _draw, sample_full_row, unpack_bitmask
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.sampling import Row, soft_cap

V, CAP = 262_144, 30.0


def mask_of(ids) -> torch.Tensor:
    """llguidance's layout: bit j of int32 word i allows token 32 i + j."""
    ok = torch.zeros(V, dtype=torch.int64)
    ok[torch.tensor(list(ids), dtype=torch.int64)] = 1
    bm = (ok.view(-1, 32) << torch.arange(32)).sum(1)
    return torch.where(bm >= 2**31, bm - 2**32, bm).to(torch.int32)


def reference(raw, bm, p, seed):
    ok = unpack_bitmask(bm, V)
    if p.greedy:
        return int(torch.argmax(raw.float().masked_fill(~ok, float("-inf"))))
    return _draw(soft_cap(raw, CAP).masked_fill(~ok, float("-inf")), p, torch.Generator().manual_seed(seed))


MASKS = {"sparse": lambda g: torch.randperm(V, generator=g)[:300].tolist(),
         "dense": lambda g: torch.randperm(V, generator=g)[: V // 2].tolist()}
PARAMS = [SamplingParams(), SamplingParams(temperature=1.0, top_k=64, top_p=0.95),
          SamplingParams(temperature=0.7, top_k=8, top_p=0.5), SamplingParams(temperature=1.0, top_p=0.9)]


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("p", PARAMS, ids=str)
def test_masked_rows_match_the_reference(kind, p):
    g = torch.Generator().manual_seed(1)
    for seed in range(4):
        raw = torch.randn(V, generator=g) * 3
        allowed = MASKS[kind](g)
        bm = mask_of(allowed)
        got = sample_full_row(raw, Row(0, p, torch.Generator().manual_seed(seed), bm), CAP)
        assert got.error is None and got.token in set(allowed)
        assert got.token == reference(raw, bm, p, seed)


def test_a_mask_allowing_nothing_is_that_rows_error():
    got = sample_full_row(torch.randn(V), Row(0, SamplingParams(), None, mask_of([])), CAP)
    assert got.error and got.token == -1


def test_greedy_with_the_argmax_allowed_and_logprobs_unmasked():
    raw = torch.randn(V)
    best = int(torch.argmax(raw))
    got = sample_full_row(raw, Row(0, SamplingParams(), None, mask_of([best, 5, 7]), logprobs=2), CAP)
    lp = torch.log_softmax(soft_cap(raw, CAP), -1)
    assert got.token == best and got.logprob == pytest.approx(float(lp[best]))
    assert [t for t, _ in got.top] == torch.topk(lp, 2).indices.tolist()
