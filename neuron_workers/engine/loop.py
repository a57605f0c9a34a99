"""EngineLoop: the one thread that drives an Engine. Everything else talks to it through a queue.

`submit(seq, sink)` adds a sequence; its events are handed to `sink` (called on the loop thread, so a
sink only hands off: e.g. `loop.call_soon_threadsafe`). `cancel(seq_id)` drops a sequence at the next
step boundary, waiting or running, and frees its slot. Commands are applied between steps; when there
is no work the thread sleeps on the queue. `on_step(stats)` reports running / waiting counts after every step,
and once more when cancels leave the engine idle (a `StepStats` with nothing decoded).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from neuron_workers.engine.events import EngineEvent, ErrorEvent

if TYPE_CHECKING:  # the server process imports this module without torch until an engine is built
    from neuron_workers.engine.sequence import Sequence

log = logging.getLogger(__name__)
Sink = Callable[[EngineEvent], None]


class ServingEngine(Protocol):
    """What a server needs of an engine (`neuron_workers.engine.Engine` is the one we ship).

    Tokenization and validation (`encode`, `encode_chat`, `new_sequence`) may run on any thread; `add`,
    `cancel` and `step` only on the engine loop's thread."""

    max_context: int
    max_batch: int
    last_decode_rows: int
    scheduler: object  # .running (slot -> sequence) and .waiting, read for stats
    sampling_defaults: dict
    max_token_chars: int

    @property
    def has_work(self) -> bool: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[dict]) -> list[int]: ...

    def new_sequence(self, prompt_ids: list[int], params, stop: list[str] | None = None) -> "Sequence": ...

    def add(self, seq: "Sequence") -> None: ...

    def cancel(self, seq_id: int) -> bool: ...

    def step(self) -> list[EngineEvent]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class StepStats:
    running: int  # sequences holding a slot after the step
    waiting: int  # sequences queued for a slot
    decoded: int  # rows in the step's decode (batch occupancy)
    max_batch: int
    prefix_query_tokens: int = 0  # since the engine started: prompt tokens admitted with prefix reuse on
    prefix_hit_tokens: int = 0  # of which a kept slot held already
    spec_draft_tokens: int = 0  # since the engine started: drafts verified
    spec_accepted_tokens: int = 0  # of which kept
    prefix_window_hit_tokens: int = 0  # of the prefix hits, those served through a restored sliding window


class EngineLoop:
    def __init__(self, engine: ServingEngine, name: str = "engine",
                 on_step: Callable[[StepStats], None] | None = None):
        self.engine, self.on_step = engine, on_step
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.sinks: dict[int, Sink] = {}
        self.steps = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, seq: "Sequence", sink: Sink) -> None:
        self.commands.put(("add", seq, sink))

    def cancel(self, seq_id: int) -> None:
        self.commands.put(("cancel", seq_id, None))

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.commands.put(("wake", None, None))
        self.thread.join(timeout)

    def _apply(self, block: bool) -> None:
        while True:
            try:
                op, arg, sink = self.commands.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if op == "add":
                self.sinks[arg.seq_id] = sink
                self.engine.add(arg)
            elif op == "cancel":
                self.engine.cancel(arg)
                self.sinks.pop(arg, None)

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = self.engine.has_work
            self._apply(block=not busy)
            if not self.engine.has_work:
                if busy:  # cancels left it idle with no step to report that: report it now
                    self._report(0)
                continue
            try:
                events = self.engine.step()
            except Exception as e:  # the engine guards sequences itself; this is a bug: fail what it holds
                log.exception("engine step failed")
                events = [ErrorEvent(seq_id, f"{type(e).__name__}: {e}") for seq_id in list(self.sinks)]
                for seq_id in list(self.sinks):
                    self.engine.cancel(seq_id)
            self.steps += 1
            self._deliver(events)
            self._report(self.engine.last_decode_rows)

    def _report(self, decoded: int) -> None:
        if self.on_step is not None:
            s, p = self.engine.scheduler, getattr(self.engine, "prefix", None)
            e = self.engine
            self.on_step(StepStats(len(s.running), len(s.waiting), decoded, e.max_batch,
                                   p.query_tokens if p else 0, p.hit_tokens if p else 0,
                                   getattr(e, "spec_draft_tokens", 0), getattr(e, "spec_accepted_tokens", 0),
                                   getattr(p, "window_hit_tokens", 0)))

    def _deliver(self, events: list[EngineEvent]) -> None:
        for ev in events:
            sink = self.sinks.get(ev.seq_id)
            if sink is None:
                continue
            if ev.final:
                del self.sinks[ev.seq_id]
            try:
                sink(ev)
            except Exception:  # a sink whose consumer is gone (event loop closed) must not stop the loop
                log.exception("event sink failed for sequence %d", ev.seq_id)
