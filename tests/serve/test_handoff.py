"""Engine thread -> event loop hand-off: a request's coroutine is woken only when a message is due, events
arrive complete and in order, and one engine step wakes the loop once for all requests."""

from __future__ import annotations

import asyncio
import threading
import time

from neuron_workers.engine.events import ErrorEvent, TokenEvent
from serve_app.handoff import Handoff, Inbox


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
        task = asyncio.create_task(inbox.take(None))
        await settle()
        from_thread(lambda: [inbox.push(time.perf_counter(), tok(i)) for i in range(5)])
        await settle()
        assert not task.done()  # five tokens, no message due yet
        from_thread(lambda: inbox.push(time.perf_counter(), tok(5, final=True)))
        got = await asyncio.wait_for(task, 30)
        assert [ev.token_id for _, ev in got] == list(range(6))

    asyncio.run(main())


def test_stream_is_not_woken_before_its_next_message_is_due_but_a_final_event_is():
    async def main():
        inbox = Inbox(Handoff(asyncio.get_running_loop()))
        from_thread(lambda: inbox.push(time.perf_counter(), tok(0)))
        first = await asyncio.wait_for(inbox.take(0.0), 30)  # the first message is due at once
        assert [ev.token_id for _, ev in first] == [0]
        task = asyncio.create_task(inbox.take(time.perf_counter() + 3600))  # next message in an hour
        await settle()
        from_thread(lambda: [inbox.push(time.perf_counter(), tok(i)) for i in (1, 2)])
        await settle()
        assert not task.done()
        from_thread(lambda: inbox.push(time.perf_counter(), ErrorEvent(1, "boom")))
        got = await asyncio.wait_for(task, 30)
        assert [type(ev).__name__ for _, ev in got] == ["TokenEvent", "TokenEvent", "ErrorEvent"]

    asyncio.run(main())


def test_one_engine_step_wakes_the_loop_once_for_all_requests():
    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakeups.append(1), real(*a))
        handoff = Handoff(loop)
        inboxes = [Inbox(handoff) for _ in range(8)]
        tasks = [asyncio.create_task(b.take(0.0)) for b in inboxes]
        await settle()
        from_thread(lambda: [b.push(time.perf_counter(), tok(7)) for b in inboxes])  # one step, 8 rows
        got = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert all(len(g) == 1 for g in got) and len(wakeups) == 1

    asyncio.run(main())


def test_many_streams_share_a_message_budget():
    """Each stream sends at most one message per stream_interval_ms; when the replica's streams together
    would exceed stream_messages_per_s, every stream's interval grows to share that budget."""
    from serve_app.config import ModelSpec
    from serve_app.model_server import ModelServer

    server = ModelServer.__new__(ModelServer)  # no engine needed for the policy
    server.spec = ModelSpec(name="m", path="/nowhere", stream_interval_ms=40, stream_messages_per_s=100)
    intervals = {}
    for n in (1, 4, 8, 32):
        server.streams = n
        intervals[n] = server._stream_interval()
    assert intervals == {1: 0.04, 4: 0.04, 8: 0.08, 32: 0.32}
