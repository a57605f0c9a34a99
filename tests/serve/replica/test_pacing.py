"""When the engine process sends a request's events (serve_app/replica/pacing.py): a stream's first tokens and every
last event at once, a stream's later tokens once per interval, a non-streaming request's all with its last,
the replica's streams sharing one message budget, a cancelled request's events never sent."""

from __future__ import annotations

from serve_app.replica.pacing import Pacer


def test_a_streams_first_tokens_go_at_once_then_once_per_interval():
    p = Pacer(interval_s=0.04, messages_per_s=100)
    p.add(1, stream=True)
    p.hold(1, "a", final=False)
    assert p.take_due(10.0) == ["a"]  # the first message: at once
    p.hold(1, "b", final=False)
    assert p.take_due(10.02) == []  # 20 ms later: not yet
    p.hold(1, "c", final=False)
    assert p.take_due(10.045) == ["b", "c"]  # an interval after the last message: all held, in order
    p.hold(1, "d", final=True)
    assert p.take_due(10.046) == ["d"]  # the last event does not wait
    assert p.requests == {} and p.streams == 0


def test_a_non_streaming_request_sends_everything_with_its_last_event():
    p = Pacer(interval_s=0.0, messages_per_s=1e9)
    p.add(7, stream=False)
    for i, t in enumerate((1.0, 2.0, 3.0)):
        p.hold(7, i, final=False)
        assert p.take_due(t) == []
    p.hold(7, 3, final=True)
    assert p.take_due(4.0) == [0, 1, 2, 3]


def test_only_due_requests_go_and_nothing_is_due_without_events():
    p = Pacer(interval_s=0.04, messages_per_s=100)
    p.add(1, stream=True)
    p.add(2, stream=False)
    assert p.take_due(0.0) == []
    p.hold(1, "s", final=False)
    p.hold(2, "n", final=False)
    assert p.take_due(0.0) == ["s"]
    p.hold(2, "n2", final=True)
    p.hold(1, "s2", final=False)
    assert p.take_due(0.01) == ["n", "n2"]  # the stream's next message is not due yet


def test_many_streams_share_a_message_budget():
    """Each stream sends at most one message per stream_interval_ms; when the replica's streams together
    would exceed stream_messages_per_s, every stream's interval grows to share that budget."""
    p = Pacer(interval_s=0.04, messages_per_s=100)
    intervals = {}
    for n in (1, 4, 8, 32):
        while p.streams < n:
            p.add(p.streams, stream=True)
        intervals[n] = p.interval()
    assert intervals == {1: 0.04, 4: 0.04, 8: 0.08, 32: 0.32}
    p.add(99, stream=False)  # a non-streaming request takes no share
    assert p.interval() == 0.32


def test_a_dropped_request_is_never_sent_and_frees_its_share():
    p = Pacer(interval_s=0.0, messages_per_s=10)
    p.add(1, stream=True)
    p.add(2, stream=True)
    assert p.interval() == 0.2
    p.hold(1, "x", final=False)
    p.drop(1)
    p.hold(1, "late", final=True)  # an event of the step that was running when it was cancelled
    assert p.take_due(5.0) == [] and p.streams == 1 and p.interval() == 0.1
    p.drop(1)  # twice is harmless
    assert p.streams == 1
