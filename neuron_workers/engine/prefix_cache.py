"""PrefixCache: what free slots still hold, and which one a new prompt should take (prefix reuse).

A sequence that finishes or is cancelled leaves its slot's KV in place, with the token history that KV
holds (`keep`): the prompt tokens prefilled so far and every generated token but the last (the last one was
never fed). A new sequence is admitted into the free slot whose kept history shares the longest usable
common prefix with its prompt (`choose`) and prefills only the rest (the engine runs it through the extend
graph); with no usable match it takes an empty slot, else the least recently used kept one.

Usable: full layers keep every position, but a sliding layer's ring (the window W plus a slack) keeps only
the newest `ring` positions written. Extending from position `lcp` needs the keys at positions
>= lcp - W + 1; a slot whose history holds K positions, whose idle decode row writes position K (it is
parked there: `DecodeBatch.park`) and whose verify steps may have written rejected drafts further (its
`reach`: at least K + 1), has overwritten every position < reach - ring. So a match of `lcp` tokens is
usable when max(0, lcp - W + 1) >= reach - ring: always while the history fits the ring, otherwise when
the history ends at most `ring - W` (the slack) tokens after the match (a chat turn whose re-rendered answer
differs from the generated ids only near its end). Anything else is a full prefill, never a wrong answer.
The reach outlives a sequence: one that reuses a slot's prefix starts from the reach its earlier occupants
left (`take` returns it), since the rings still hold whatever they wrote past the match.
At least one prompt token is always fed (it gives the first token's logits), and a match shorter than
`MIN_REUSE` tokens (the BOS and turn marker every chat starts with) is not worth an extend call. Past the
slack, a kept sliding window (`engine/prefix_windows.py`) makes a match usable up to its point. Pure host
logic.
"""

from __future__ import annotations

import itertools

from neuron_workers.engine.prefix_windows import WindowPool

MIN_REUSE = 16


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n, i = min(len(a), len(b)), 0
    while i < n and a[i:i + 64] == b[i:i + 64]:  # whole blocks compared in C
        i = min(n, i + 64)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self, window: int, ring: int, windows: WindowPool | None = None):
        self.window, self.ring, self.windows = window, ring, windows  # windows: kept sliding windows, if any
        self.kept: dict[int, tuple[list[int], int, int]] = {}  # free slot -> (history with KV, reach, last use)
        self._clock = itertools.count()
        self.query_tokens = 0  # prompt tokens of the sequences admitted (Prometheus: prefix_cache_query_tokens)
        self.hit_tokens = 0  # of which read from a kept slot instead of prefilled (restored windows' included)
        self.window_hit_tokens = 0  # of which served through a restored window

    def usable(self, lcp: int, reach: int) -> bool:
        """Whether the first `lcp` positions of a slot written up to `reach` (exclusive) are all still there."""
        return max(0, lcp - self.window + 1) >= reach - self.ring

    def keep(self, slot: int, history: list[int], reach: int = 0) -> None:
        """`slot` is free and its KV holds `history` (positions 0 .. len - 1); positions up to `reach` may have
        been written past it (rejected drafts), and its parked decode row writes position len(history)."""
        if history:
            self.kept[slot] = (list(history), max(reach, len(history) + 1), next(self._clock))
        else:
            self.kept.pop(slot, None)

    def drop(self, slot: int) -> None:
        self.kept.pop(slot, None)
        if self.windows is not None:
            self.windows.invalidate(slot, 0)

    def match(self, prompt: list[int], slot: int) -> tuple[int, int | None]:
        """(tokens of `prompt` that `slot` can give without prefilling them (0: none usable), the kept window's
        pool entry to restore first, or None when the rings hold them)."""
        if slot not in self.kept:
            return 0, None
        history, reach, _ = self.kept[slot]
        lcp = min(common_prefix(prompt, history), len(prompt) - 1)
        if lcp < MIN_REUSE:
            return 0, None
        if self.usable(lcp, reach):
            return lcp, None
        kept = self.windows.best(slot, lcp) if self.windows is not None else None
        return kept if kept is not None else (0, None)

    def choose(self, prompt: list[int], free: list[int], live: tuple = ()) -> tuple[int, int, int | None, int | None]:
        """(slot, reused tokens, window entry to restore or None, slot to clone from or None) for `prompt` among
        the `free` slots: the longest usable match (the most recently used on a tie), else an empty slot, else
        the least recently used kept one. A match that would cut the history of the slot holding it short (by
        more than the slack) is cloned into another free slot when one is empty or less recently used, so that
        slot keeps its longer history (a shared system prompt must not erase the conversations after it).
        `live`: (slot, history, reach) of running sequences whose prompt is in their slot (with kept windows
        only): a longer match there is cloned into a free slot (the n choices of one request prefill once)."""
        best = max(((*self.match(prompt, s), self.kept[s][2], s) for s in free if s in self.kept),
                   key=lambda m: (m[0], m[2]), default=None)
        empty = [s for s in free if s not in self.kept]
        running = max(((self._live(prompt, h, r), s) for s, h, r in live), default=(0, None))
        if self.windows is not None and free and running[0] > (best[0] if best is not None else 0):
            target = empty[0] if empty else min(free, key=lambda t: self.kept[t][2])
            return target, running[0], None, running[1]
        if best is not None and best[0] > 0:
            n, entry, used, s = best
            if n + self.ring - self.window < len(self.kept[s][0]) and self.windows is not None:
                other = empty[0] if empty else min((t for t in free if t != s), key=lambda t: self.kept[t][2],
                                                   default=None)
                if other is not None and (other in empty or self.kept[other][2] < used):
                    return other, n, entry, s
            return s, n, entry, None
        if empty:
            return empty[0], 0, None, None
        return min(free, key=lambda s: self.kept[s][2]), 0, None, None

    def _live(self, prompt: list[int], history: list[int], reach: int) -> int:
        """Tokens of `prompt` a running sequence's slot (its `history`, written up to `reach`) can give."""
        lcp = min(common_prefix(prompt, history), len(prompt) - 1)
        return lcp if lcp >= MIN_REUSE and self.usable(lcp, reach) else 0

    def take(self, slot: int, prompt_tokens: int, reused: int, entry: int | None = None,
             src: int | None = None, src_reach: int | None = None) -> int:
        """A sequence of `prompt_tokens` was admitted into `slot`, reusing `reused` of them (through the kept
        window `entry`, if not None; from slot `src`'s KV cloned into `slot`, if not None); returns the reach the
        sequence carries on. Reusing the rings: the slot's (earlier occupants wrote past the match too).
        Through a window: the rings hold only positions reused - W .. reused - 1 and what the sequence writes,
        so later matches must not reach before those (reach = reused - W + ring). Reusing nothing: 0 (it writes
        every position it reads itself). `src_reach`: a running `src`'s (a kept one's is known here)."""
        _, reach, _ = self.kept.pop(slot, ((), 0, 0))
        if src is not None and src in self.kept:
            reach = self.kept[src][1]  # the clone's rings are src's
            self.kept[src] = (*self.kept[src][:2], next(self._clock))
        elif src is not None:
            reach = src_reach
        self.query_tokens += prompt_tokens
        self.hit_tokens += reused
        if self.windows is not None:
            self.windows.invalidate(slot, 0 if src is not None else reused)  # from there on: the new sequence's
            if entry is not None:
                self.windows.touch(entry)
                self.windows.restored += 1
                self.window_hit_tokens += reused
                return reused - self.window + self.ring
        return reach if reused else 0
