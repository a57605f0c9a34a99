"""The exact top-K that every decode graph ends with (cpu, the xla twin and the Neuron build run this code),
in a shape the Neuron compiler takes at Gemma-4's 262,144-wide rows.

The SDK's TopK op is only ever run by NxD / NxD Inference on narrow rows (per-rank shards; their 16,384-wide
test cases are xfail on trn1), k above 16,384 is refused (aws-neuron-sdk#1339, the maintainers' answer: tile
it), and neuronx-cc 2.26 is reported failing (ISGV902) on rows of 32,768 and more. So a row is cut into
tiles of at most `TILE_LIMIT`, each tile gives its own top-k (one op over a [rows * tiles, tile] view, with
a non-negative `dim`, as every NxD caller passes), the tile's ids are offset back to the row, and one more
top-k over the tiles' candidates picks the row's K. Under tensor parallelism (`sharded_topk`) each rank
does that on its vocabulary shard and only the [B, tp * k] candidates (values and ids) are all-gathered,
with the rank offsets added after the gather, as NxD's `operators/topk.py` does: the full logits are never
gathered for this graph.

Exactness: the K best values of a row are among the K best of the tile (or shard) holding them, so the
values equal `torch.topk`'s; the ids are the ids of those values. The order of equal values (and which of
several equal values at the K-th place is kept) is left to the op, as with `torch.topk`: the host settles it
(`engine/topk.canonical`).

`op(x, k, dim) -> (values, indices)` is `torch_topk_op` here; the Neuron build passes the SDK's TopK.

Every op call (tiled or not, the merge, the shards' candidates) gets fp32 values and its ids become int32 at once
(`_op`): NxD Inference casts logits to fp32 before its sampler's TopK and tests that op in fp32 only, and the public
TopK returns u32 ids, which an index (`clusters[top]`, a gather) would refuse. The values leave in the input's dtype
(bf16 values are exact in fp32 and back).
"""

from __future__ import annotations

from typing import Callable

import torch

TILE_LIMIT = 8192  # the widest row one TopK op is given (NxD's runnable trn1 tests: rows of 64 and 3,158)
K_LIMIT = 16384  # the largest k the SDK's TopK takes (aws-neuron-sdk#1339)

TopKOp = Callable[[torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]]


def torch_topk_op(x: torch.Tensor, k: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(x, k, dim=dim)


def tile_width(width: int, k: int, limit: int = TILE_LIMIT) -> int:
    """The tile a row of `width` is cut into for a top-`k`: `limit` for rows wider than it (every real
    Gemma-4 row: 262,144 = 32 tiles of 8,192, or 16 per rank at tp=2). Rows that fit one tile (only the tiny
    test models: 512 wide) are cut in two when each half still holds k, so the same two-stage code runs in
    their tests and builds instead of a single op."""
    if width > limit:
        return limit
    half = width // 2
    return half if width % 2 == 0 and half >= k else width


def _op(op: TopKOp, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One top-k op call over the rows of x in fp32; its ids int32 (the SDK's are u32, torch's int64)."""
    vals, idx = op(x.float(), k, 1)
    return vals, idx.to(torch.int32)


def tiled_topk(x: torch.Tensor, k: int, op: TopKOp = torch_topk_op, tile: int | None = None):
    """(values, ids) of the k largest of each row of x [B, W], best first: a top-k per tile, then over the
    tiles' candidates. Every op runs on fp32; values come back in x's dtype, ids int32."""
    b, width = x.shape
    tile = tile or tile_width(width, k)
    if width <= tile:
        vals, ids = _op(op, x, k)
        return vals.to(x.dtype), ids
    n, rest = divmod(width, tile)
    kt = min(k, tile)
    vals, idx = _op(op, x[:, : n * tile].reshape(b * n, tile), kt)  # every whole tile in one op
    offsets = torch.arange(n, device=x.device, dtype=torch.int32) * tile
    ids = (idx.reshape(b, n, kt) + offsets[None, :, None]).reshape(b, n * kt)
    vals = vals.reshape(b, n * kt)
    if rest:  # a last, narrower tile (no Gemma-4 width has one)
        rv, ri = _op(op, x[:, n * tile:], min(k, rest))
        vals, ids = torch.cat([vals, rv], dim=1), torch.cat([ids, ri + n * tile], dim=1)
    best, top = merge(vals, ids, k, op)
    return best.to(x.dtype), top


def merge(vals: torch.Tensor, ids: torch.Tensor, k: int, op: TopKOp = torch_topk_op):
    """The k best of candidate (vals, ids) [B, M]: one op over M (never wider than the tile at real sizes:
    32 x 256 = 8,192 candidates for 32 tiles, 2 x 256 at tp=2), then the ids of the winners (int32). Values in
    vals' dtype."""
    best, pos = _op(op, vals, k)
    return best.to(vals.dtype), torch.gather(ids.to(torch.int32), 1, pos.to(torch.int64))


def sharded_topk(local: torch.Tensor, k: int, all_gather: Callable[[torch.Tensor], torch.Tensor], vocab: int,
                 op: TopKOp = torch_topk_op):
    """The row's top-k from this rank's logits shard local [B, vocab / tp]: a tiled top-k on the shard,
    an all-gather of the [B, k] candidates (values and ids) along the last dim, the rank offsets (rank r's
    shard starts at r * vocab / tp; added after the gather, so one SPMD program serves every rank), then the
    top-k of the [B, tp * k] candidates. Every rank ends with the same answer."""
    shard = local.shape[1]
    tp = vocab // shard
    kl = min(k, shard)
    vals, ids = tiled_topk(local, kl, op)
    vals, ids = all_gather(vals), all_gather(ids.to(torch.int32))
    offsets = (torch.arange(tp, device=ids.device, dtype=torch.int32) * shard).repeat_interleave(kl)
    return merge(vals, ids + offsets[None, :], k, op)
