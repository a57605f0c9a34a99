"""The replica's engine in its own process (serve_app/replica/engine_process.py), over the fake engine: a request's
events in order, paced (serve_app/replica/pacing.py) rather than one message per step, a refusal naming the
param, cancel freeing the slot, a start failure raised in the replica, the child on its `engine_cpus`, and
a child that dies failing what it held and the health check. Also
the replica's messages: a non-streaming request is one `Finished`, a stream's tail rides on `Finished`,
and `Started` goes out only when the first token is late."""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time

import pytest

from neuron_workers.engine.events import ErrorEvent, TokenEvent
from neuron_workers.engine.loop import StepStats
from neuron_workers.errors import UserError
from serve_app.config import ModelSpec
from serve_app.events import Delta, Failed, Finished, GenerateRequest, Started
from serve_app.replica.engine_process import EngineProcess, Prepared, Refused, Token


def spec(step_s=0.005, **kw) -> ModelSpec:
    return ModelSpec(**{"name": "m", "path": ".", "engine": "doubles.fake_engine:FakeEngine", "max_context": 64,
                        "max_batch": 2, "engine_options": {"step_s": step_s}, **kw})


def completion(n=5, **kw) -> GenerateRequest:
    return GenerateRequest(**{"kind": "completion", "prompt": "hello", "max_tokens": n, "ignore_eos": True, **kw})


def take_until_final(q: queue.Queue, timeout=20.0) -> list:
    out = []
    while not out or not out[-1].final:
        out.append(q.get(timeout=timeout))
    return out


@pytest.fixture(scope="module")
def proc():
    p = EngineProcess(spec())
    yield p
    p.close()


def test_a_request_runs_in_the_child_and_its_events_come_back_in_order(proc):
    q = queue.Queue()
    proc.submit(completion(5), q.put)
    items = take_until_final(q)
    assert isinstance(items[0], Prepared) and items[0].prompt_tokens == 5  # one id per character
    tokens = items[1:]
    assert all(isinstance(t, Token) for t in tokens) and len(tokens) == 5
    assert tokens[-1].event.finish_reason == "length" and tokens[0].admitted_at is not None
    assert proc.max_context == 64 and proc.max_batch == 2 and proc.alive()
    q2 = queue.Queue()  # the same request again: the fake engine is deterministic
    proc.submit(completion(5), q2.put)
    assert [t.event.token_id for t in take_until_final(q2)[1:]] == [t.event.token_id for t in tokens]


def test_a_request_that_cannot_run_is_refused_naming_its_param(proc):
    q = queue.Queue()
    proc.submit(completion(5, prompt="x" * 5000), q.put)
    (item,) = take_until_final(q)
    assert isinstance(item, Refused) and item.failed.status == 400
    assert item.failed.param == "prompt" and item.failed.code == "context_length_exceeded"


def test_events_come_back_paced_not_one_message_per_step():
    """A non-streaming request's tokens arrive in one message with its last; a stream's first token at once,
    the rest at most once per stream_interval_ms; each token keeps the time the engine made it."""
    p = EngineProcess(spec(step_s=0.005, stream_interval_ms=50))
    try:
        messages = []
        dispatch = p._dispatch
        p._dispatch = lambda msg: (messages.append([e[1].token_id for e in msg[1]]) if msg[0] == "step" else None,
                                   dispatch(msg))
        for stream in (False, True):
            messages.clear()
            q = queue.Queue()
            p.submit(completion(20, stream=stream), lambda item, q=q: q.put((time.perf_counter(), item)))
            got = take_until_final_timed(q)
            with_tokens = [m for m in messages if m]
            ats = [item.at for _, item in got]
            assert len(ats) == 20 and ats == sorted(ats) and all(item.at <= seen for seen, item in got)
            if not stream:
                assert len(with_tokens) == 1 and len(with_tokens[0]) == 20
            else:  # 20 steps of 5 ms: the first tokens at once, then at most one message per 50 ms, then the
                # last; a loaded box makes the steps (ats) slower, and the bound follows the time they took
                most = 3 + int((ats[-1] - ats[0]) / 0.05)
                assert got[0][0] < ats[-1] - 0.05 and 2 <= len(with_tokens) <= min(most, 19), (with_tokens, ats)
        assert p.steps >= 30  # the child's own count of steps (about one per token), though few messages came
    finally:
        p.close()


def take_until_final_timed(q: queue.Queue, timeout=20.0) -> list:
    """(arrival, Token) pairs of one request, its Prepared skipped."""
    out = []
    while not out or not out[-1][1].final:
        seen, item = q.get(timeout=timeout)
        if not isinstance(item, Prepared):
            out.append((seen, item))
    return out


def test_cancelling_the_last_request_reports_the_engine_idle():
    p = EngineProcess(spec(step_s=0.05))
    try:
        q = queue.Queue()
        rid = p.submit(completion(50), q.put)
        assert isinstance(q.get(timeout=20), Prepared)
        deadline = time.monotonic() + 10
        while not (p.stats and p.stats.running) and time.monotonic() < deadline:
            time.sleep(0.01)
        p.cancel(rid)
        while p.stats.running and time.monotonic() < deadline:  # no step follows: the loop reports it anyway
            time.sleep(0.01)
        assert p.stats.running == 0 and p.stats.waiting == 0
        steps = p.steps
        time.sleep(0.3)
        assert p.steps == steps
    finally:
        p.close()


def test_events_that_cannot_be_sent_fail_their_request_and_not_the_others():
    from serve_app.replica.engine_child import EngineChild
    from serve_app.replica.pacing import Pacer

    class Conn:
        def __init__(self):
            self.sent = []

        def send(self, msg):
            if any(getattr(e[1], "text", "") == "unpicklable" for e in msg[1]):
                raise TypeError("cannot pickle")
            self.sent.append(msg)

    class Loop:
        steps = 7

    child = EngineChild.__new__(EngineChild)  # the sending half alone, no engine
    child.conn, child.send_lock, child.loop, child.rids, child.seqs = Conn(), threading.Lock(), Loop(), {}, {}
    child.pacer, child.decoded, child.sent_at = Pacer(0.0, 100), [], 0.0
    cancelled = []
    child._cancel = cancelled.append

    good = (1, TokenEvent(11, 5, "fine", "length"), None, 0.0, 1.0)
    bad = (2, TokenEvent(12, 6, "unpicklable", None), None, 0.0, 1.0)
    child.pacer.add(1, False)
    child.pacer.add(2, True)
    for e in (good, bad):
        child.pacer.hold(e[0], e, e[1].final)
    child._flush(StepStats(1, 0, 2, 2))
    sent = [e for msg in child.conn.sent for e in msg[1]]
    assert good in sent  # the other request's last event still went
    failed = [e for e in sent if e[0] == 2]
    assert len(failed) == 1 and isinstance(failed[0][1], ErrorEvent) and failed[0][1].final
    assert cancelled == [2]  # and its sequence stops


def test_cancel_frees_the_slot_for_the_next_request():
    p = EngineProcess(spec(step_s=0.1))  # 50 tokens would hold a slot for 5 s
    try:
        held = [queue.Queue(), queue.Queue()]
        rids = [p.submit(completion(50), q.put) for q in held]  # both slots
        for q in held:
            assert isinstance(q.get(timeout=20), Prepared)
        for rid in rids:
            p.cancel(rid)
        q = queue.Queue()
        t = time.monotonic()
        p.submit(completion(3), q.put)
        assert take_until_final(q)[-1].event.finish_reason == "length"
        assert time.monotonic() - t < 3.0  # it did not wait for the cancelled two to finish
        assert not p.requests and all(q.empty() or not q.get().final for q in held)
    finally:
        p.close()


def test_a_request_after_the_child_died_fails_at_once():
    p = EngineProcess(spec())
    try:
        p.proc.kill()
        p.reader.join(10)
        q = queue.Queue()
        p.submit(completion(3), q.put)
        (item,) = take_until_final(q, timeout=1)
        assert isinstance(item.event, ErrorEvent)
    finally:
        p.close()


def test_a_start_failure_is_raised_in_the_replica(tmp_path):
    with pytest.raises(UserError, match="config.json"):  # the real factory, a directory with no checkpoint
        EngineProcess(spec(engine="serve_app.replica.engines:build_worker_engine", path=str(tmp_path)))
    with pytest.raises(RuntimeError, match="no_such_factory"):  # a bug: the replica fails to start, saying why
        EngineProcess(spec(engine="doubles.fake_engine:no_such_factory"))


def test_engine_cpus_resolve_negative_entries_from_the_end_and_refuse_a_cpu_not_allowed():
    from serve_app.replica.host import resolve_cpus

    assert resolve_cpus([-1], [0, 1, 2, 3]) == [3]
    assert resolve_cpus([-1, -2], [4, 6]) == [4, 6]
    assert resolve_cpus([-3], [0, 1]) == [1]  # wraps where there are fewer CPUs
    assert resolve_cpus([2, -1], [0, 2, 5]) == [2, 5]
    with pytest.raises(UserError, match=r"CPU 7 is not one") as e:
        resolve_cpus([7], [0, 1])
    assert e.value.param == "engine_cpus"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's per-thread CPU affinity")
def test_the_engine_process_runs_on_its_engine_cpus():
    last = max(os.sched_getaffinity(0))
    p = EngineProcess(spec(engine_cpus=[-1]))
    try:
        threads = os.listdir(f"/proc/{p.proc.pid}/task")  # the engine thread and every other one
        assert p.info["cpus"] == [last] and len(threads) >= 2
        assert all(os.sched_getaffinity(int(t)) == {last} for t in threads)
        q = queue.Queue()
        p.submit(completion(3), q.put)
        assert take_until_final(q)[-1].event.finish_reason == "length"
    finally:
        p.close()
    with pytest.raises(UserError, match="engine_cpus") as e:  # the replica fails to start, saying why
        EngineProcess(spec(engine_cpus=[100_000]))
    assert e.value.param == "engine_cpus"


def test_a_child_that_dies_fails_what_it_held_and_the_health_check():
    p = EngineProcess(spec(step_s=0.05))
    try:
        q = queue.Queue()
        p.submit(completion(50), q.put)
        assert isinstance(q.get(timeout=20), Prepared)
        p.proc.kill()
        items = take_until_final(q)
        assert isinstance(items[-1], Token) and isinstance(items[-1].event, ErrorEvent)
        p.reader.join(10)
        assert not p.alive()
    finally:
        p.close()


@pytest.fixture(scope="module")
def servers():
    """ModelServers over the fake engine: a fast one and one whose first token is later than
    HEADERS_WITHIN_S (a step of 0.4 s)."""
    from serve_app.replica.model_server import ModelServer

    out = {"fast": ModelServer(spec(step_s=0.002).model_dump()), "slow": ModelServer(spec(step_s=0.4).model_dump())}
    yield out
    for s in out.values():
        s.engine.close()


async def events(server, req) -> list:
    return [ev async for ev in server.generate(req)]


def test_a_non_streaming_request_is_one_answer(servers):
    fin = asyncio.run(servers["fast"].complete(completion(6)))
    assert isinstance(fin, Finished) and fin.completion_tokens == 6 and len(fin.text) == 6
    assert fin.prompt_tokens == 5
    bad = asyncio.run(servers["fast"].complete(completion(5, prompt="x" * 5000)))
    assert isinstance(bad, Failed) and bad.status == 400 and bad.param == "prompt"


def test_a_stream_sends_its_first_token_at_once_and_its_tail_on_finished(servers):
    evs = asyncio.run(events(servers["fast"], completion(12, stream=True)))
    assert isinstance(evs[0], Delta) and isinstance(evs[-1], Finished)  # no Started: the token was quick
    assert not any(isinstance(e, Started) for e in evs)
    text = "".join(e.text for e in evs[:-1]) + evs[-1].text
    whole = asyncio.run(servers["fast"].complete(completion(12)))
    assert text == whole.text and evs[-1].completion_tokens == 12


def test_a_stream_whose_first_token_is_late_gets_started_first(servers):
    evs = asyncio.run(events(servers["slow"], completion(2, stream=True)))
    assert isinstance(evs[0], Started) and evs[0].prompt_tokens == 5  # sent once the prompt was prepared
    assert isinstance(evs[-1], Finished) and evs[-1].completion_tokens == 2


def test_a_refused_stream_is_refused_before_anything_else_however_slow_the_engine(servers):
    evs = asyncio.run(events(servers["slow"], completion(5, prompt="x" * 5000, stream=True)))
    assert len(evs) == 1 and isinstance(evs[0], Failed) and evs[0].param == "prompt"


def test_a_replica_whose_engine_process_dies_fails_its_requests_and_its_health_check():
    from serve_app.replica.model_server import ModelServer

    server = ModelServer(spec(step_s=0.05).model_dump())
    try:
        async def scenario():
            evs = []
            async for ev in server.generate(completion(50, stream=True)):
                evs.append(ev)
                if len(evs) == 1:
                    server.engine.proc.kill()
            return evs

        evs = asyncio.run(scenario())
        assert isinstance(evs[-1], Failed) and evs[-1].status == 500 and "engine process" in evs[-1].message
        with pytest.raises(RuntimeError, match="engine process"):
            server.check_health()
    finally:
        server.engine.close()


def test_a_sequence_error_naming_a_field_is_the_requests_400_anything_else_a_500():
    from serve_app.replica.model_server import failure

    mine = failure(ErrorEvent(3, "the grammar from `tools` failed: too many items", "tools"))
    ours = failure(ErrorEvent(3, "RuntimeError: boom"))
    assert (mine.status, mine.param, mine.type) == (400, "tools", "invalid_request_error")
    assert (ours.status, ours.param, ours.type) == (500, None, "server_error") and "boom" in ours.message
