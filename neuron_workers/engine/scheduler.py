"""Scheduler: B slots (the KV rows compiled into the graphs), a FIFO waiting queue, admission between
decode steps, and a slot freed the moment its sequence finishes or is cancelled. Pure host logic."""

from __future__ import annotations

import time
from collections import deque

from neuron_workers.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, max_batch: int, prefill_tokens_per_step: int):
        self.prefill_tokens_per_step = prefill_tokens_per_step
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
            seq = self.waiting.popleft()
            seq.slot, seq.status, seq.admitted_at = self.free_slots.pop(0), Status.RUNNING, time.perf_counter()
            self.running[seq.slot] = seq
            admitted.append(seq)
            tokens += n
        return admitted

    def finish(self, seq: Sequence) -> None:
        """End `seq` and free its slot for the next admission."""
        seq.status = Status.FINISHED
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
