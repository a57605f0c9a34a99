"""Events from the thread that receives them (the replica's engine reader, `engine_process.py`: one
message per engine step) to the replica's event loop, with as few wake-ups of the loop as the stream needs.
Every wake-up is a self-pipe write, a GIL hand-off and a coroutine resumption, all CPU the busy host's
engine and Serve compete for.

- `Handoff`: one per event loop. Another thread's calls are queued and run on the loop in one batch;
  only the first call after a batch schedules it (`call_soon_threadsafe`): one wake-up per engine step
  for every request that needs waking in that step.
- `Inbox`: one per request. The reader thread appends each event; the request's coroutine is woken only
  when its next message is due: at once for a final event, else not before the time it asked for (a
  stream's next interval; a non-streaming request asks for the final event only).
"""

from __future__ import annotations

import asyncio
import threading
import time


class Handoff:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.calls, self.lock, self.armed = loop, [], threading.Lock(), False

    def call(self, fn, *args) -> None:
        """From any thread: fn(*args) on the loop, soon, in order."""
        with self.lock:
            self.calls.append((fn, args))
            if self.armed:
                return
            self.armed = True
        self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self.lock:
            calls, self.calls, self.armed = self.calls, [], False
        for fn, args in calls:
            fn(*args)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Inbox:
    """One request's (time, event) pairs, pushed by the reader thread, taken in batches by the request."""

    def __init__(self, handoff: Handoff):
        self.handoff, self.items, self.lock = handoff, [], threading.Lock()
        self.final = False  # a final event is waiting
        self.waiter: asyncio.Future | None = None
        self.not_before: float | None = None  # the waiter's time (perf_counter); None: only a final event wakes it

    def push(self, at: float, event) -> None:
        """Reader thread: keep the event; wake the request if it is waiting and this makes a message due."""
        with self.lock:
            self.items.append((at, event))
            self.final = self.final or event.final
            fut = self.waiter
            if fut is None or not (event.final or (self.not_before is not None and at >= self.not_before)):
                return
            self.waiter = None
        self.handoff.call(_wake, fut)

    async def take(self, not_before: float | None) -> list:
        """Every event pushed so far, once there is one and a message is due: a final event is there, or
        `not_before` (perf_counter) has passed. None waits for the final event."""
        loop = asyncio.get_running_loop()
        while True:
            with self.lock:
                due = self.final or (not_before is not None and time.perf_counter() >= not_before)
                if self.items and due:
                    items, self.items = self.items, []
                    return items
                fut = self.waiter = loop.create_future()
                self.not_before = not_before
            timer, wait = None, (not_before - time.perf_counter()) if not_before is not None else 0.0
            if wait > 0:  # events pushed before then do not wake us: look again when they are due
                timer = loop.call_later(wait, _wake, fut)
            try:
                await fut
            finally:
                if timer is not None:
                    timer.cancel()
                with self.lock:
                    if self.waiter is fut:
                        self.waiter = None
