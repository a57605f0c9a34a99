"""Scheduler: B slots (the KV rows compiled into the graphs), a FIFO waiting queue, admission between
decode steps, and a slot freed the moment its sequence finishes or is cancelled. Pure host logic.

Chunked prefill (`chunk` > 0): a prompt longer than `chunk` is admitted into a slot and prefilled `chunk`
tokens a step (`prefill_work`), at most one chunk per step and one such prompt at a time; the step's token
budget (`prefill_tokens_per_step`) is shared by the decoding rows (one token each) and the prefill work,
which always gets one unit (a chunk or a whole short prompt) so nothing starves; the waiting queue stays FIFO
(a long prompt at its head waits while another one is chunking, and so do those behind it). Cancelling a
chunking sequence frees its slot at the step boundary, as any other.

Prefix reuse (`prefix`, a `PrefixCache`): a waiting sequence is admitted into the free slot that already
holds the longest usable prefix of its prompt (`seq.reused` tokens, counted as prefilled) and prefills the
rest through the extend graph, `extend_t` tokens a step; a match past the rings' slack restores a kept sliding
window first (`seq.restore`), and a prefill piece ends at each point whose window is to be kept (`_piece`).
Reuse only picks which free slot the head of the queue takes: admission order stays FIFO, so no waiting
sequence is starved by it."""

from __future__ import annotations

import time
from collections import deque

from neuron_workers.engine.prefix_cache import PrefixCache
from neuron_workers.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, max_batch: int, prefill_tokens_per_step: int, chunk: int = 0,
                 prefix: PrefixCache | None = None, extend_t: int = 0):
        self.prefill_tokens_per_step, self.chunk = prefill_tokens_per_step, chunk
        self.prefix, self.extend_t = prefix, extend_t or chunk  # extend_t: T of the extend graph (reuse)
        self.chunking: Sequence | None = None  # admitted, its prompt partly prefilled (seq.prefilled)
        self.free_slots = list(range(max_batch))
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot -> sequence

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Waiting sequences moved into free slots this step (`prefill_work` without decoding rows)."""
        return [seq for seq, _ in self.prefill_work()]

    def prefill_work(self, decode_rows: int = 0) -> list[tuple[Sequence, int]]:
        """This step's prefill work, in order: (sequence, prompt tokens to prefill now, from `seq.prefilled`);
        a sequence whose prompt is not done after them is chunking. The chunking sequence goes first (it was
        admitted first), then waiting ones in FIFO order while the budget left after `decode_rows` allows (with
        chunking off, whole prompts up to the budget, as before chunks existed). A waiting sequence's slot and
        reused prefix come from the prefix cache; its cost is what it still has to prefill."""
        work, chunked = [], False
        budget = self.prefill_tokens_per_step - (decode_rows if self.chunk else 0)
        if self.chunking is not None:
            seq = self.chunking
            n = self._piece(seq, seq.prefilled)
            work.append((seq, n))
            budget, chunked = budget - n, True
        while self.waiting and self.free_slots:
            seq = self.waiting[0]
            if self._twin_prefilling(seq):
                break  # its prompt's twin is being prefilled: it clones that slot once the prefill is done
            scored = seq.prompt_logprobs is not None  # every prompt position's logits: nothing reused
            live = self._live() if self.prefix is not None and not scored else {}
            slot, hit, entry, src = self.prefix.choose([] if scored else seq.keys, self.free_slots,
                                                       tuple(live.values())) \
                if self.prefix else (self.free_slots[0], 0, None, None)
            if hit and self._splits_a_block(seq, hit):
                hit, entry, src = 0, None, None  # prefilled whole instead (the prefill graph holds the block)
            cost = self._piece(seq, hit)
            long = cost < len(seq.prompt_ids) - hit
            if work and (cost > budget or (long and chunked)):
                break
            self._admit_one(slot, hit, entry, src, live[src][2] if src in live else None)
            if long:
                self.chunking, chunked = seq, True
            work.append((seq, cost))
            budget -= cost
        return work

    def _splits_a_block(self, seq: Sequence, hit: int) -> bool:
        """Whether reusing `hit` prompt tokens would leave a bidirectional block (the 12B's image) to an extend graph
        that cannot hold it whole: the match ends inside it, or it is longer than the extend graph's T."""
        return any(m.bidirectional and m.end > hit and (m.offset < hit or m.length > self.extend_t)
                   for m in seq.media)

    def _unit(self, start: int) -> int:
        """The most prompt tokens one step prefills from `start`: a chunk (0: the whole prompt, with chunking
        off and nothing reused); a reused prefix's rest always goes through the extend graph."""
        return self.chunk or (self.extend_t if start else 0)

    def _piece(self, seq: Sequence, start: int) -> int:
        """The prompt tokens of `seq`'s next prefill piece from `start`: a unit (or the whole rest), ended at a
        kept-window point whose window the rings would no longer hold after it (`engine/prefix_windows.py`)."""
        rest = len(seq.prompt_ids) - start
        unit = self.extend_t if seq.prompt_logprobs is not None else self._unit(start)
        n = min(rest, unit) if unit else rest
        slack = self.prefix.ring - self.prefix.window if self.prefix is not None else 0
        cut = next((p for p in seq.keep_points if start < p < start + n - slack), None)
        n = n if cut is None else cut - start
        # a piece never ends inside a bidirectional block (its tokens see each other: one graph call holds it)
        split = next((m.offset for m in seq.media if m.bidirectional and start < m.offset < start + n < m.end), None)
        return n if split is None else split - start

    def prefilled(self, seq: Sequence, n: int) -> None:
        """`n` more prompt tokens of `seq` are in its slot."""
        seq.prefilled += n
        if self.chunking is seq and seq.prefilled >= len(seq.prompt_ids):
            self.chunking = None

    def _live(self) -> dict[int, tuple]:
        """slot -> (slot, history, reach) of the running sequences whose prompt is in their slot, which a new
        sequence may clone (with kept windows, `PrefixCache.choose`)."""
        if self.prefix.windows is None:
            return {}
        return {s.slot: (s.slot, s.cached, max(s.reach, len(s.cached) + 1)) for s in self.running.values()
                if s.output_ids}

    def _twin_prefilling(self, seq: Sequence) -> bool:
        """Whether a running sequence with the same prompt is still being prefilled (the n choices of a request):
        `seq` then waits a step or so and clones its slot instead of prefilling the prompt again."""
        if self.prefix is None or self.prefix.windows is None or seq.prompt_logprobs is not None:
            return False
        return any(not s.output_ids and s.keys == seq.keys for s in self.running.values())

    def _admit_one(self, slot: int, reused: int, entry: int | None = None, src: int | None = None,
                   src_reach: int | None = None) -> Sequence:
        seq = self.waiting.popleft()
        self.free_slots.remove(slot)
        seq.slot, seq.status, seq.admitted_at = slot, Status.RUNNING, time.perf_counter()
        seq.prefilled = seq.reused = reused
        # what the engine copies into the slot before its first piece: another slot's KV, a kept window
        seq.restore = (src, entry) if src is not None or entry is not None else None
        if self.prefix is not None:
            seq.reach = max(seq.reach, self.prefix.take(slot, len(seq.prompt_ids), reused, entry, src, src_reach))
        self.running[seq.slot] = seq
        return seq

    def finish(self, seq: Sequence) -> None:
        """End `seq` and free its slot for the next admission."""
        seq.status = Status.FINISHED
        if self.chunking is seq:
            self.chunking = None
        if seq.slot is not None and self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            self.free_slots.append(seq.slot)
            self.free_slots.sort()

    def cancel(self, seq_id: int) -> Sequence | None:
        """Remove a waiting sequence, or end a running one; None if it is not here (already finished)."""
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                seq.status, seq.finish_reason = Status.FINISHED, "abort"
                return seq
        for seq in self.running.values():
            if seq.seq_id == seq_id:
                seq.finish_reason = "abort"
                self.finish(seq)
                return seq
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
