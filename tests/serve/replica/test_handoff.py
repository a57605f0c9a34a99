"""Engine reader -> event loop hand-off: a non-streaming request's coroutine is woken only by its last event,
a stream's by any, events arrive complete and in order, and one message wakes the loop once for all
requests."""

from __future__ import annotations

import asyncio
import threading
import time

from neuron_workers.engine.events import ErrorEvent, TokenEvent
from serve_app.replica.handoff import Handoff, Inbox


def tok(i: int, final: bool = False) -> TokenEvent:
    return TokenEvent(1, i, f"t{i}", "length" if final else None)


def from_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


async def settle(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_non_streaming_request_wakes_only_for_its_last_event():
    async def main():
        inbox = Inbox(Handoff(asyncio.get_running_loop()))
        task = asyncio.create_task(inbox.take(until_final=True))
        await settle()
        from_thread(lambda: [inbox.push(time.perf_counter(), tok(i)) for i in range(5)])
        await settle()
        assert not task.done()  # five tokens, no message due yet
        from_thread(lambda: inbox.push(time.perf_counter(), tok(5, final=True)))
        got = await asyncio.wait_for(task, 30)
        assert [ev.token_id for _, ev in got] == list(range(6))

    asyncio.run(main())


def test_stream_is_woken_by_any_event_and_gets_all_that_arrived():
    async def main():
        inbox = Inbox(Handoff(asyncio.get_running_loop()))
        task = asyncio.create_task(inbox.take(until_final=False))
        await settle()
        assert not task.done()  # nothing yet
        from_thread(lambda: [inbox.push(time.perf_counter(), tok(i)) for i in (0, 1)])  # one message, 2 tokens
        got = await asyncio.wait_for(task, 30)
        assert [ev.token_id for _, ev in got] == [0, 1]
        from_thread(lambda: inbox.push(time.perf_counter(), ErrorEvent(1, "boom")))
        got = await asyncio.wait_for(inbox.take(until_final=False), 30)
        assert [type(ev).__name__ for _, ev in got] == ["ErrorEvent"]

    asyncio.run(main())


def test_one_engine_step_wakes_the_loop_once_for_all_requests():
    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakeups.append(1), real(*a))
        handoff = Handoff(loop)
        inboxes = [Inbox(handoff) for _ in range(8)]
        tasks = [asyncio.create_task(b.take(until_final=False)) for b in inboxes]
        await settle()
        from_thread(lambda: [b.push(time.perf_counter(), tok(7)) for b in inboxes])  # one step, 8 rows
        got = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert all(len(g) == 1 for g in got) and len(wakeups) == 1

    asyncio.run(main())
