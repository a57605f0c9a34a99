"""Kept sliding windows on a backend's KV buffers: a pool of `entries` windows per sliding KV buffer, and the
copies prefix reuse makes (`engine/prefix_windows.py`): one slot's window (the ring entries of positions
start .. start + W - 1) into a pool entry after a prefill piece, and back into a slot's ring before an extend;
and one slot's first n positions (full layers) and rings into another slot (`clone`: a match is served in a
free slot while the slot that holds it keeps its longer history).

The KV buffers are the graphs' list (k, v per KV-owning layer, `spec.kv_specs`); a sliding buffer is
[B, H, ring, D] and position p lives at ring entry p % ring, so a window is W entries of the ring (positions
below 0 wrap to entries that hold nothing the window's queries read). A pool buffer is [entries, H, W, D]. The
copies are index_select / index_copy on one slot of one buffer: W x H x D values per buffer, nothing else moves.
"""

from __future__ import annotations

import torch

from neuron_workers.model.dims import SLIDING, ModelDims


def sliding_buffers(dims: ModelDims) -> list[int]:
    """Indices of the sliding layers' K and V buffers in the KV list."""
    return [2 * j + i for j, layer in enumerate(dims.kv_layers) if dims.layer_types[layer] == SLIDING
            for i in (0, 1)]


def make_pool(kv: list[torch.Tensor], which: list[int], entries: int, window: int) -> list[torch.Tensor]:
    """Zeroed pool buffers [entries, H, W, D], one per sliding KV buffer, on the buffers' device and dtype."""
    return [kv[i].new_zeros((entries, kv[i].shape[1], window, kv[i].shape[3])) for i in which]


def ring_entries(start: int, window: int, ring: int, device=None) -> torch.Tensor:
    """[W]: the ring entries of positions start .. start + W - 1."""
    return (torch.arange(window, device=device) + start) % ring


def save(kv: list[torch.Tensor], pool: list[torch.Tensor], which: list[int], slot: int, entry: int,
         start: int) -> None:
    """Pool entry `entry` <- slot `slot`'s window from position `start`, in every sliding buffer."""
    for buf, i in zip(pool, which):
        idx = ring_entries(start, buf.shape[2], kv[i].shape[2], kv[i].device)
        buf[entry] = kv[i][slot].index_select(1, idx)


def restore(kv: list[torch.Tensor], pool: list[torch.Tensor], which: list[int], slot: int, entry: int,
            start: int) -> None:
    """Slot `slot`'s ring entries of positions start .. start + W - 1 <- pool entry `entry`, in place."""
    for buf, i in zip(pool, which):
        idx = ring_entries(start, buf.shape[2], kv[i].shape[2], kv[i].device)
        kv[i][slot].index_copy_(1, idx, buf[entry])


def clone(kv: list[torch.Tensor], which: list[int], src: int, dst: int, n: int) -> None:
    """Slot `dst` <- slot `src`'s positions 0 .. n - 1 of every full buffer and the whole ring of every sliding
    one (`which`), in place."""
    for i, buf in enumerate(kv):
        if i in which:
            buf[dst] = buf[src]
        else:
            buf[dst, :, :n] = buf[src, :, :n]
