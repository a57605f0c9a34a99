"""Kept sliding windows on device state (the traced module's, `graph_model.NeuronGraphModel`): the pool is more
module state beside the KV buffers, one [entries, H, W, D] buffer per sliding KV buffer (`pool_<j>`), and the
three copies prefix reuse makes (`engine/prefix_windows.py`; the cpu backend's in-place versions are
`kept_windows.py`) are graphs of their own over that state, with static shapes and every index a small int32 input
(widened in the graph where index_copy wants int64):

- `window_save` (slot, entry, start): pool entry <- the slot's ring entries of positions start .. start + W - 1;
- `window_restore` (slot, entry, start): the slot's ring entries <- the pool entry;
- `slot_clone` (src, dst): slot dst <- slot src, every KV buffer whole (the engine asks for src's first n
  positions of the full layers and its rings; copying the whole slot is a superset of that, and dst is a free
  slot whose positions past n are written before any query reads them), so n is no input and the shape static.

Each is written out of place from the old value (index_copy of the buffer it replaces), and re-assigns every
other state buffer unchanged, as the draft graph does (`NeuronGraphModel.draft_state`), so a trace links all of
them as aliased state. Ring entries come from `(arange(W) + start) % ring` in the graph."""

from __future__ import annotations

import torch

from neuron_workers.model.kept_windows import sliding_buffers

SAVE, RESTORE, CLONE = "window_save", "window_restore", "slot_clone"
# each graph's inputs: keywords of the traced module's forward, int32 [1] each (distinct names: NxD routes by them)
INPUTS = {SAVE: ("save_slot", "save_entry", "save_start"), RESTORE: ("restore_slot", "restore_entry", "restore_start"),
          CLONE: ("clone_src", "clone_dst")}


def inputs(phase: str, *values: int, device=None) -> dict[str, torch.Tensor]:
    """The keyword inputs of window graph `phase` for these indices (int32 [1] each)."""
    return {name: torch.tensor([v], dtype=torch.int32, device=device) for name, v in zip(INPUTS[phase], values,
                                                                                          strict=True)}


def called(kwargs: dict) -> tuple[str, list] | None:
    """(the window graph, its inputs in order) that `forward`'s keywords name, or None for the other graphs."""
    for phase, names in INPUTS.items():
        if kwargs.get(names[0]) is not None:
            return phase, [kwargs[n] for n in names]
    return None


def make_pool(module, entries: int) -> list[str]:
    """Register the pool buffers on `module` (zeros, beside its KV buffers, same device and dtype); their names."""
    which = sliding_buffers(module.dims)
    names = []
    for j, i in enumerate(which):
        kv = getattr(module, module.kv_names[i])
        name = f"pool_{j}"
        module.register_buffer(name, kv.new_zeros((entries, kv.shape[1], module.dims.sliding_window, kv.shape[3])))
        names.append(name)
    module.pool_names, module.pool_of = names, which
    return names


def ring_entries(start: torch.Tensor, window: int, ring: int) -> torch.Tensor:
    """[W] int32: the ring entries of positions start .. start + W - 1 (`start` [1] int32)."""
    return (torch.arange(window, dtype=start.dtype, device=start.device) + start) % ring


def save(module, slot: torch.Tensor, entry: torch.Tensor, start: torch.Tensor) -> None:
    slot, entry = slot.long(), entry.long()  # index_copy takes int64 indices (torch-xla checks)
    for name, i in zip(module.pool_names, module.pool_of):
        kv, pool = getattr(module, module.kv_names[i]), getattr(module, name)
        idx = ring_entries(start, pool.shape[2], kv.shape[2]).long()
        setattr(module, name, pool.index_copy(0, entry, kv.index_select(0, slot).index_select(2, idx)))
    _keep(module, module.kv_names)


def restore(module, slot: torch.Tensor, entry: torch.Tensor, start: torch.Tensor) -> None:
    slot, entry = slot.long(), entry.long()
    for name, i in zip(module.pool_names, module.pool_of):
        kv_name = module.kv_names[i]
        kv, pool = getattr(module, kv_name), getattr(module, name)
        idx = ring_entries(start, pool.shape[2], kv.shape[2]).long()
        rows = kv.index_select(0, slot).index_copy(2, idx, pool.index_select(0, entry))
        setattr(module, kv_name, kv.index_copy(0, slot, rows))
    _keep(module, [module.kv_names[i] for i in range(len(module.kv_names)) if i not in module.pool_of])
    _keep(module, module.pool_names)


def clone(module, src: torch.Tensor, dst: torch.Tensor) -> None:
    src, dst = src.long(), dst.long()
    for name in module.kv_names:
        kv = getattr(module, name)
        setattr(module, name, kv.index_copy(0, dst, kv.index_select(0, src)))
    _keep(module, module.pool_names)


def _keep(module, names: list[str]) -> None:
    """Re-assign `names` unchanged (a copy of each): linked as state by a trace, as they were."""
    for name in names:
        setattr(module, name, getattr(module, name).clone())


def run(module, phase: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    """One window graph; returns a one-element tensor (a traced graph has an output)."""
    if phase == SAVE:
        save(module, a, b, c)
    elif phase == RESTORE:
        restore(module, a, b, c)
    elif phase == CLONE:
        clone(module, a, b)
    else:
        raise ValueError(f"no window graph {phase!r}")
    return a + 0


class WindowCopies:
    """A backend's `save_window` / `restore_window` / `clone_slot` as the window graphs (the xla and neuron
    backends); the backend's `_window(phase, *indices)` runs one."""

    def save_window(self, slot: int, entry: int, start: int) -> None:
        self._window(SAVE, slot, entry, start)

    def restore_window(self, slot: int, entry: int, start: int) -> None:
        self._window(RESTORE, slot, entry, start)

    def clone_slot(self, src: int, dst: int, n: int) -> None:
        self._window(CLONE, src, dst)  # the whole slot: a superset of its first n positions (see above)
