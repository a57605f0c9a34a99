"""The extend graphs over every slot (R = B rows: speculative verify, `extend_BxT_all`), reading the KV in place.

The host gives R = B rows in any order (`extend_inputs`: the engine's rows first, the idle slots after; `slots[r]` is
row r's slot). Gathering each layer's buffers by `slots` would copy every slot's KV each step (~0.8 GiB on E2B at
B = 32, context 4096). Instead the graph puts the *host inputs* in slot order (`index_select` of the ids, positions,
masks, last_idx and per-layer inputs: small), runs the layers with `ExtendKV(in_place=True)` (row r is slot r: each
layer attends over its buffers as they are after the write, as `decode` does), and puts its outputs (candidates,
hidden states: small) back in the host's row order. Sliding layers read the ring after the write, so their mask is
the host's ring mask where the chunk did not write and the chunk's causal mask where it did (`ring_mask`); used for
T <= the ring's slack (`in_place_ok`: every verify but the one of k = slack drafts, which gathers; at T = slack + 1
the in-place graph differed from the gathering one in float64, so that shape is left to the gather).
"""

from __future__ import annotations

import torch

from neuron_workers.model.extend_kv import ExtendKV

ROW_INPUTS = ("input_ids", "position_ids", "per_layer_inputs", "mask_full", "mask_sliding", "last_idx")


def in_place_ok(dims, batch: int, rows: int, t: int, ring: int) -> bool:
    """Whether an extend graph of `rows` x `t` runs in place: every slot, and T within the ring's slack."""
    return rows == batch and t <= ring - dims.sliding_window


def slot_order(slots: torch.Tensor) -> torch.Tensor:
    """The row that holds each slot (the inverse of the permutation `slots`), without a sort."""
    rows = torch.arange(slots.shape[0], dtype=slots.dtype, device=slots.device)
    return torch.zeros_like(slots).scatter(0, slots, rows)


def ring_mask(mask_sliding: torch.Tensor, position_ids: torch.Tensor, last_idx: torch.Tensor, ring: int,
              ) -> torch.Tensor:
    """[R, 1, T, ring + T] (the old ring, then the chunk's own keys) -> [R, 1, T, ring] over the ring after the
    write: ring slot s took chunk token j = (s - start) % ring when j < n (n = last_idx + 1 real tokens), which
    query i sees when j <= i (T <= window: within it); the other slots keep the host's mask of the old ring."""
    t = position_ids.shape[1]
    start, n = position_ids[:, :1], (last_idx + 1)[:, None]  # [R, 1]
    s = torch.arange(ring, dtype=start.dtype, device=start.device)[None, :]
    j = torch.remainder(s - start, ring)  # [R, ring]
    written = (j < n)[:, None, None, :]  # [R, 1, 1, ring]
    i = torch.arange(t, dtype=start.dtype, device=start.device)[:, None]  # [T, 1]
    causal = (j[:, None, :] <= i[None, :, :])[:, None]  # [R, 1, T, ring]
    zero = torch.zeros((), dtype=mask_sliding.dtype, device=mask_sliding.device)
    neg = torch.full((), torch.finfo(mask_sliding.dtype).min, dtype=mask_sliding.dtype, device=mask_sliding.device)
    return torch.where(written, torch.where(causal, zero, neg), mask_sliding[..., :ring])


def in_place_forward(graph, x: dict, kv: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """`graph` (a `graphs.GemmaGraph` of the extend phase) over host inputs `x` (name -> tensor, R = B rows in the
    host's order) and the KV buffers `kv`: (its heads in the host's row order, *the new KV buffers)."""
    slots = x["slots"]
    order = slot_order(slots)
    y = {name: (t.index_select(0, order) if name in ROW_INPUTS else t) for name, t in x.items()}
    ring = y["mask_sliding"].shape[-1] - y["position_ids"].shape[1]
    y["mask_sliding"] = ring_mask(y["mask_sliding"], y["position_ids"], y["last_idx"], ring)
    rows = torch.arange(slots.shape[0], dtype=slots.dtype, device=slots.device)
    cache = ExtendKV(graph.dims, kv, y["position_ids"], y["last_idx"], rows, in_place=True)
    hidden = graph._decoder(y, cache)
    if graph.spec.per_position:
        r, t = hidden.shape[:2]
        heads = tuple(h.reshape(r, t, -1) for h in graph._head(hidden.reshape(r * t, 1, -1)))
    else:
        heads = graph._head(hidden)
    return (*(h.index_select(0, slots) for h in heads), *cache.kv)
