"""Scheduler: B slots (the KV rows compiled into the graphs), a FIFO waiting queue, admission between
decode steps, and a slot freed the moment its sequence finishes or is cancelled. Pure host logic.

Chunked prefill (`chunk` > 0): a prompt longer than `chunk` is admitted into a slot and prefilled `chunk`
tokens a step (`prefill_work`), at most one chunk per step and one such prompt at a time; the step's token
budget (`prefill_tokens_per_step`) is shared by the decoding rows (one token each) and the prefill work,
which always gets one unit (a chunk or a whole short prompt) so nothing starves; the waiting queue stays FIFO
(a long prompt at its head waits while another one is chunking, and so do those behind it). Cancelling a
chunking sequence frees its slot at the step boundary, as any other."""

from __future__ import annotations

import time
from collections import deque

from neuron_workers.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, max_batch: int, prefill_tokens_per_step: int, chunk: int = 0):
        self.prefill_tokens_per_step, self.chunk = prefill_tokens_per_step, chunk
        self.chunking: Sequence | None = None  # admitted, its prompt partly prefilled (seq.prefilled)
        self.free_slots = list(range(max_batch))
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot -> sequence

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Waiting sequences moved into free slots, in arrival order, up to the prefill token budget
        (at least one when a slot is free, so a long prompt is never starved)."""
        admitted, tokens = [], 0
        while self.waiting and self.free_slots:
            n = len(self.waiting[0].prompt_ids)
            if admitted and tokens + n > self.prefill_tokens_per_step:
                break
            admitted.append(self._admit_one())
            tokens += n
        return admitted

    def prefill_work(self, decode_rows: int = 0) -> list[tuple[Sequence, int]]:
        """This step's prefill work, in order: (sequence, prompt tokens to prefill now); a sequence whose
        prompt is not done after its tokens is chunking. The chunking sequence goes first (it was admitted
        first), then waiting ones in FIFO order while the budget left after `decode_rows` allows."""
        if not self.chunk:
            return [(s, len(s.prompt_ids)) for s in self.admit()]
        work, budget, chunked = [], self.prefill_tokens_per_step - decode_rows, False
        if self.chunking is not None:
            seq = self.chunking
            work.append((seq, min(self.chunk, len(seq.prompt_ids) - seq.prefilled)))
            budget, chunked = budget - self.chunk, True
        while self.waiting and self.free_slots:
            n = len(self.waiting[0].prompt_ids)
            long = n > self.chunk
            cost = self.chunk if long else n
            if work and (cost > budget or (long and chunked)):
                break
            seq = self._admit_one()
            if long:
                self.chunking, chunked = seq, True
            work.append((seq, min(n, self.chunk)))
            budget -= cost
        return work

    def prefilled(self, seq: Sequence, n: int) -> None:
        """`n` more prompt tokens of `seq` are in its slot."""
        seq.prefilled += n
        if self.chunking is seq and seq.prefilled >= len(seq.prompt_ids):
            self.chunking = None

    def _admit_one(self) -> Sequence:
        seq = self.waiting.popleft()
        seq.slot, seq.status, seq.admitted_at = self.free_slots.pop(0), Status.RUNNING, time.perf_counter()
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
