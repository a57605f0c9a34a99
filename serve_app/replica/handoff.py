"""Events from the thread that receives them (the replica's engine reader, `engine_process.py`: one
message from the engine process at a time, already paced by `serve_app.replica.pacing`) to the replica's event
loop, with as few wake-ups of the loop as the request needs.
Every wake-up is a self-pipe write, a GIL hand-off and a coroutine resumption, all CPU the busy host's
engine and Serve compete for.

- `Handoff`: one per event loop. Another thread's calls are queued and run on the loop in one batch;
  only the first call after a batch schedules it (`call_soon_threadsafe`): one wake-up per message of
  the engine process for every request that needs waking in it.
- `Inbox`: one per request. The reader thread appends each event; the request's coroutine is woken by
  any event if it is a stream, else by its final event only.
"""

from __future__ import annotations

import asyncio
import threading


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
        self.any = False  # the waiter wakes for any event (a stream), not only a final one

    def push(self, at: float, event) -> None:
        """Reader thread: keep the event (made at `at`, perf_counter); wake the request if it waits for it."""
        with self.lock:
            self.items.append((at, event))
            self.final = self.final or event.final
            fut = self.waiter
            if fut is None or not (event.final or self.any):
                return
            self.waiter = None
        self.handoff.call(_wake, fut)

    async def take(self, until_final: bool) -> list:
        """Every (time, event) pushed so far, once there is one (`until_final`: once the final one is there)."""
        loop = asyncio.get_running_loop()
        while True:
            with self.lock:
                if self.items and (self.final or not until_final):
                    items, self.items = self.items, []
                    return items
                fut = self.waiter = loop.create_future()
                self.any = not until_final
            try:
                await fut
            finally:
                with self.lock:
                    if self.waiter is fut:
                        self.waiter = None
