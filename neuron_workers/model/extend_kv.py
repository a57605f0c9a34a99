"""ExtendKV: the duck-typed cache of the extend graph (R rows x T new tokens over what their slots hold).

Each KV-owning layer writes the chunk's T positions of every row into the old buffer, read-modify-write:
the buffer viewed as [B*H*N, D] rows, `torch.scatter` of R*H*T of them (full layers at `pos`, sliding
rings at `pos % ring`); a position past the row's last real token (`last_idx`: padding, or an idle row
with last_idx -1) writes back the value it reads there (`torch.gather` of the same R*H*T entries), so
nothing outside the real tokens changes and no whole buffer is rewritten. T is at most the ring, so no
entry is written twice.

Attention: full layers attend over their slot's buffer after the write (mask [R, 1, T, max_context]);
sliding layers over the ring *as it was before the chunk* followed by the chunk's own T keys (mask
[R, 1, T, ring + T]), so a chunk never needs ring slots it has just overwritten: chunked prefill needs no
ring slack. KV-shared layers read what the storing layer returned (HF's `shared_kv_states`), with the same
masks, as in the other graphs.

In place (`in_place`, the graphs over every slot: R = B rows in slot order, row r is slot r; `in_place.py` puts the
rows in that order and back): no layer gathers its slots' buffers. Full layers attend over the buffer after the
write as it is (as `decode` does); sliding layers over the ring after the write, which still holds every key a
query of the chunk needs when T <= ring slack + 1 (`RING_SLACK`: what bounds a verify), under the mask
`in_place.ring_mask` derives from the host's.
"""

from __future__ import annotations

import torch

from neuron_workers.model.dims import FULL, ModelDims


class ExtendKV:
    def __init__(self, dims: ModelDims, kv: list[torch.Tensor], position_ids: torch.Tensor, last_idx: torch.Tensor,
                 slots: torch.Tensor, in_place: bool = False):
        self.dims, self.kv, self.in_place = dims, kv, in_place
        self.index = {layer: 2 * j for j, layer in enumerate(dims.kv_layers)}
        self.pos, self.slots = position_ids, slots  # [R, T], [R] (the ids' dtype: int32 on the Neuron graphs)
        rows, t = position_ids.shape
        step = torch.arange(t, dtype=last_idx.dtype, device=last_idx.device)
        self.valid = (step[None, :] <= last_idx[:, None])  # [R, T]: real tokens
        self._flat: dict[tuple[int, ...], torch.Tensor] = {}  # buffer shape -> index [R*H*T, D]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        j = self.index[layer_idx]
        full = self.dims.layer_types[layer_idx] == FULL
        old_k, old_v = self.kv[j], self.kv[j + 1]
        self.kv[j], self.kv[j + 1] = self._write(old_k, k), self._write(old_v, v)
        if self.in_place:  # rows are the slots in order: the buffers as they are after the write
            return self.kv[j], self.kv[j + 1]
        if full:  # attend over the slot's whole buffer, the chunk included
            return self.kv[j].index_select(0, self.slots), self.kv[j + 1].index_select(0, self.slots)
        return (torch.cat([old_k.index_select(0, self.slots), k.to(old_k.dtype)], dim=2),
                torch.cat([old_v.index_select(0, self.slots), v.to(old_v.dtype)], dim=2))

    def _write(self, buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, h, n, d = buf.shape
        idx, keep = self._indices(buf.shape)
        flat = buf.reshape(b * h * n, d)
        new = x.to(buf.dtype).reshape(-1, d)  # [R, H, T, D] -> [R*H*T, D]
        new = torch.where(keep, new, torch.gather(flat, 0, idx))  # padding writes back what is there
        return torch.scatter(flat, 0, idx, new).reshape(b, h, n, d)  # reads the old buffer

    def _indices(self, shape) -> tuple[torch.Tensor, torch.Tensor]:
        key = tuple(shape)
        if key not in self._flat:
            _, h, n, d = key
            rows, t = self.pos.shape
            heads = torch.arange(h, dtype=self.pos.dtype, device=self.pos.device)
            base = (self.slots[:, None] * h + heads[None, :]) * n  # [R, H]
            flat = base[:, :, None] + (self.pos % n)[:, None, :]  # [R, H, T]
            keep = self.valid[:, None, :].expand(rows, h, t).reshape(-1, 1)
            # contiguous: torch 2.13's CPU gather reads wrong rows through an expanded (stride 0) int32 index
            self._flat[key] = (flat.reshape(-1, 1).expand(rows * h * t, d).contiguous(), keep)
        return self._flat[key]
