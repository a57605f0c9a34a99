"""MixedKV: the duck-typed cache of the mixed graph (`spec.mixed_spec`): B decode tokens, one per slot, and T
chunk tokens of one row, on one token axis [1, B + T], so that every linear layer and the MLP read their weights
once for both (a chunk step then costs about one decode step, not a decode step plus an extend step).

Each KV-owning layer writes, into the old buffer, first the B decode tokens' K/V (as `graphs.DecodeKV`: row i at
its position) and then the chunk's (as `extend_kv.ExtendKV`, one row): the chunking slot's own decode row is
parked at the chunk's first position (`DecodeBatch.park`), so the chunk overwrites what it wrote.

Attention is split, and `update` returns both parts as a `SplitKV` (which KV-shared layers also read, through
HF's `shared_kv_states`): the decode part attends over the B rows of the buffer after the writes (as `decode`);
the chunk part over its slot's full buffer after the writes, or, in sliding layers, over its ring as it was
before this graph followed by the chunk's own T keys (as `extend`). `split_attention` runs the registered kernel
on each part and joins them again on the token axis.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from neuron_workers.model.dims import FULL, ModelDims
from neuron_workers.model.extend_kv import ExtendKV


class SplitKV(NamedTuple):
    """Keys (or values) of the mixed graph: the decode tokens' [B, H, N, D], the chunk's [1, H, N', D]."""

    decode: torch.Tensor
    chunk: torch.Tensor


class MixedKV:
    def __init__(self, dims: ModelDims, kv: list[torch.Tensor], position_ids: torch.Tensor, last_idx: torch.Tensor,
                 slots: torch.Tensor, batch: int):
        self.dims, self.kv, self.batch = dims, kv, batch
        self.index = {layer: 2 * j for j, layer in enumerate(dims.kv_layers)}
        self.decode_pos = position_ids[0, :batch]  # [B]
        self.chunk = ExtendKV(dims, kv, position_ids[:, batch:], last_idx, slots)  # its _write, one row
        self.slots = slots
        self._scatter: dict[tuple[int, ...], torch.Tensor] = {}

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        j = self.index[layer_idx]
        full = self.dims.layer_types[layer_idx] == FULL
        old_k, old_v = self.kv[j], self.kv[j + 1]
        self.kv[j], self.kv[j + 1] = self._write(old_k, k), self._write(old_v, v)
        if full:
            return (SplitKV(self.kv[j], self.kv[j].index_select(0, self.slots)),
                    SplitKV(self.kv[j + 1], self.kv[j + 1].index_select(0, self.slots)))
        own_k, own_v = k[:, :, self.batch:].to(old_k.dtype), v[:, :, self.batch:].to(old_v.dtype)  # the chunk's
        return (SplitKV(self.kv[j], torch.cat([old_k.index_select(0, self.slots), own_k], 2)),
                SplitKV(self.kv[j + 1], torch.cat([old_v.index_select(0, self.slots), own_v], 2)))

    def _write(self, buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The decode tokens' K/V (x[:, :, :B], row i at its position), then the chunk's (x[:, :, B:])."""
        b = self.batch
        dec = x[0, :, :b].transpose(0, 1)[:, :, None, :].to(buf.dtype)  # [B, H, 1, D]
        buf = torch.scatter(buf, 2, self._index(buf.shape), dec)  # reads the old buffer
        return self.chunk._write(buf, x[:, :, b:])

    def _index(self, shape) -> torch.Tensor:
        key = tuple(shape)
        if key not in self._scatter:
            b, h, n, d = key
            self._scatter[key] = (self.decode_pos % n).reshape(b, 1, 1, 1).expand(b, h, 1, d)
        return self._scatter[key]


def split_attention(kernel, module, query, key: SplitKV, value: SplitKV, attention_mask, **kwargs):
    """`kernel` (the registered attention) on the decode tokens and on the chunk's, joined on the token axis:
    query [1, Hq, B + T', D] (T' = T, or 1 after the KV-shared layers kept only the chunk's last position), mask
    [1, 1, B + T', N]; returns [1, B + T', Hq, D] as the kernel does."""
    b = key.decode.shape[0]
    q_dec = query[0, :, :b].transpose(0, 1)[:, :, None, :]  # [B, Hq, 1, D]
    m_dec = attention_mask[0, :, :b].transpose(0, 1)[:, :, None, :]  # [B, 1, 1, N]
    dec, _ = kernel(module, q_dec, key.decode, value.decode, m_dec, **kwargs)  # [B, 1, Hq, D]
    chunk, _ = kernel(module, query[:, :, b:], key.chunk, value.chunk, attention_mask[:, :, b:], **kwargs)
    return torch.cat([dec.transpose(0, 1), chunk], dim=1), None
