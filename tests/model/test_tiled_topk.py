"""The graphs' tiled top-K (`model.tiled_topk`) is exact: the values equal `torch.topk`'s, the ids are the ids
of those values (and equal torch.topk's when no values tie), at Gemma-4's real width and at the tiny models'
width; every op it runs sees a row no wider than the tile limit and a non-negative dim; at tp > 1 only the
[B, tp * k] candidates are gathered, and the answer is the unsharded one."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.engine.topk import MARGIN, canonical
from neuron_workers.model.tiled_topk import K_LIMIT, TILE_LIMIT, sharded_topk, tile_width, tiled_topk


def recording_op(seen: list):
    def op(x, k, dim):
        assert dim >= 0 and x.shape[dim] <= TILE_LIMIT and k <= K_LIMIT, (tuple(x.shape), k, dim)
        seen.append((tuple(x.shape), k))
        return torch.topk(x, k, dim=dim)
    return op


@pytest.mark.parametrize("width,k,tiles", [(262144, 256, 32), (131072, 256, 16), (512, 256, 2),
                                           (3 * 8192 + 100, 256, 4), (1000, 7, 2), (300, 256, 1)])
def test_equals_torch_topk_and_ops_stay_within_the_tile(width, k, tiles):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(3, width, generator=g).to(torch.bfloat16).float() + torch.arange(width) * 1e-6  # no ties
    seen = []
    v, i = tiled_topk(x, k, recording_op(seen))
    rv, ri = torch.topk(x, k)
    assert torch.equal(v, rv) and torch.equal(i.long(), ri)
    assert len(seen) == (1 if tiles == 1 else 2 + (width % tile_width(width, k) != 0))
    if tiles > 1:
        assert seen[0][0][0] == 3 * (width // tile_width(width, k))  # every whole tile in one op


def test_ties_keep_exact_values_and_valid_ids():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 40, (4, 262144), generator=g).to(torch.bfloat16)  # thousands of ties per value
    v, i = tiled_topk(x, 256)
    rv, _ = torch.topk(x.float(), 256)
    assert torch.equal(v.float(), rv)
    assert torch.equal(x.gather(1, i.long()), v) and all(len(set(r.tolist())) == 256 for r in i)


def test_canonical_order_matches_torch_topk_when_ties_are_few():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 262144, generator=g) * 3).to(torch.bfloat16)  # bf16: some ties, few at the top
    k = 256
    a = canonical(*[t for t in tiled_topk(x, k)], k - MARGIN)
    b = canonical(*[t for t in torch.topk(x, k)], k - MARGIN)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("tp,vocab", [(2, 262144), (2, 512), (4, 1024)])
def test_sharded_gathers_candidates_only_and_equals_the_whole_row(tp, vocab):
    g = torch.Generator().manual_seed(tp)
    x = torch.randn(2, vocab, generator=g) + torch.arange(vocab) * 1e-6
    shards = x.chunk(tp, dim=1)
    k = 256
    gathered = []

    def answer(rank):
        def all_gather(t):  # every rank's tensor of the same call, in rank order (the rank's own included)
            outs = [tiled_topk(s, min(k, vocab // tp))[0 if t.is_floating_point() else 1] for s in shards]
            gathered.append(tuple(t.shape))
            return torch.cat(outs, dim=-1)
        return sharded_topk(shards[rank], k, all_gather, vocab, recording_op([]))

    rv, ri = torch.topk(x, k)
    for rank in range(tp):
        v, i = answer(rank)
        assert torch.equal(v, rv) and torch.equal(i.long(), ri)
    assert set(gathered) == {(2, min(k, vocab // tp))}  # candidates, never [B, vocab / tp] logits
