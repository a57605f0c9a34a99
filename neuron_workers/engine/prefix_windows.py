"""Kept sliding windows: prefix reuse past the rings' slack (a shared system prompt, a re-rendered turn, a repeated
prompt). Pure host bookkeeping; the copies themselves are the backend's (`save_window` / `restore_window`).

A slot's full layers keep every position its history wrote, but its sliding rings keep only the newest `ring`
positions, so a match that ends more than the slack (ring - W) before the slot's history is not usable from the
rings (`PrefixCache.usable`). So while a prompt is prefilled, the window of every sliding layer as it stands at a
few chosen points P of it (positions P - W .. P - 1) is copied into a pool entry (`WindowPool`, `entries` of them,
on the device beside the KV). A later prompt whose match with the slot's history reaches P takes the slot, the
entry is copied back into the slot's rings, and it prefills from P: exact, since every key P needs is then where
the extend graph reads it. A match falls back to the longest kept point at or before it.

The points (`keep_points`): the end of the first turn (the system prompt, or the first user turn), found from
the prompt's turn-end token (`<turn|>` and the newline after it); the prompt's
last position but one (a repeated prompt, and a next turn whose previous answer re-renders differently, match at
least that far; the last prompt token is always fed); without turns (plain completions), the last multiple of
`stride` before it. A prefill piece is cut at a point whose window it would otherwise run past
(`Scheduler._piece`), and the window is saved right after that piece (`Prefills._keep_windows`).

An entry belongs to its slot: a sequence admitted into the slot that keeps only r < P of its history writes
positions P needs, so entries past r are dropped (`invalidate`); eviction is least recently used over the pool.
"""

from __future__ import annotations

import itertools


def keep_points(ids: list[int], turn_end: int | None, stride: int, min_point: int) -> tuple[int, ...]:
    """The positions of `ids` at which a prefill keeps the sliding windows, ascending."""
    ends = [i + 2 for i, t in enumerate(ids[:-2]) if t == turn_end] if turn_end is not None else []
    points = {ends[0]} if ends else set()
    last = len(ids) - 1
    if not ends and stride:
        points.add(last - last % stride)
    points.add(last)
    return tuple(sorted(p for p in points if min_point <= p <= last))


class WindowPool:
    """Which pool entry holds which (slot, point) window; least recently used eviction."""

    def __init__(self, entries: int):
        self.entries = entries
        self.free = list(range(entries))
        self.at: dict[int, dict[int, int]] = {}  # slot -> {point: entry}
        self.owner: dict[int, tuple[int, int]] = {}  # entry -> (slot, point)
        self.used: dict[int, int] = {}  # entry -> last use
        self._clock = itertools.count()
        self.saved = self.restored = self.evicted = 0  # since the engine started

    def best(self, slot: int, limit: int) -> tuple[int, int] | None:
        """(point, entry) of `slot`'s longest kept window at or before `limit`, if any."""
        points = [p for p in self.at.get(slot, ()) if p <= limit]
        if not points:
            return None
        p = max(points)
        return p, self.at[slot][p]

    def holds(self, slot: int, point: int) -> bool:
        return point in self.at.get(slot, ())

    def claim(self, slot: int, point: int) -> int:
        """An entry for (slot, point)'s window, evicting the least recently used one when none is free."""
        if not self.free:
            self._drop(min(self.used, key=self.used.get))
            self.evicted += 1
        entry = self.free.pop()
        self.at.setdefault(slot, {})[point] = entry
        self.owner[entry] = (slot, point)
        self.touch(entry)
        self.saved += 1
        return entry

    def touch(self, entry: int) -> None:
        self.used[entry] = next(self._clock)

    def invalidate(self, slot: int, keep_up_to: int) -> None:
        """`slot` now holds other tokens from position `keep_up_to` on: its windows past that are gone."""
        for p, entry in list(self.at.get(slot, {}).items()):
            if p > keep_up_to:
                self._drop(entry)

    def _drop(self, entry: int) -> None:
        slot, point = self.owner.pop(entry)
        del self.at[slot][point]
        self.used.pop(entry, None)
        self.free.append(entry)
