"""Fast tests, no Ray cluster: the drain middleware, readiness from Serve's state, the gate's head and body
limits, autoscaling defaults, and the run wrapper's signal handling."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve_app.config import AppArgs, ModelSpec
from serve_app.ops import drain, gate, health
from serve_app.ops.autoscale import autoscaling_config


def run(coro):
    return asyncio.run(coro)


class Client:
    """Drives an ASGI app with one request; records what it sends."""

    def __init__(self, path="/v1/completions", method="POST", headers=(), body_parts=(b"{}",), part_delay=0.0):
        self.scope = {"type": "http", "path": path, "raw_path": path.encode(), "method": method,
                      "headers": list(headers), "query_string": b""}
        self.parts, self.delay, self.sent = list(body_parts), part_delay, []

    async def receive(self):
        if self.parts:
            await asyncio.sleep(self.delay)
            part = self.parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(self.parts)}
        await asyncio.sleep(3600)

    async def send(self, msg):
        self.sent.append(msg)

    def status(self):
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def sse_app(n_events: int, every_s: float):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for i in range(n_events):
            await asyncio.sleep(every_s)
            await send({"type": "http.response.body", "body": f"data: {i}\n\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
    return app


def json_app(after_s: float):
    async def app(scope, receive, send):
        await asyncio.sleep(after_s)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})
    return app


@pytest.fixture
def state(monkeypatch):
    s = drain.DrainState()
    s.timeout_s, s.abort_grace_s = 0.3, 1.0
    monkeypatch.setattr(drain, "STATE", s)
    return s


def test_drain_finishes_short_requests_ends_long_ones_in_shape_and_refuses_new(state):
    short_stream, long_stream, long_json, late = Client(), Client(), Client(), Client()

    async def scenario():
        tasks = [asyncio.create_task(drain.Drain(sse_app(3, 0.05))(short_stream.scope, short_stream.receive,
                                                                   short_stream.send)),
                 asyncio.create_task(drain.Drain(sse_app(1000, 0.05))(long_stream.scope, long_stream.receive,
                                                                     long_stream.send)),
                 asyncio.create_task(drain.Drain(json_app(60))(long_json.scope, long_json.receive, long_json.send))]
        await asyncio.sleep(0.1)
        assert len(state.inflight) == 3
        result = asyncio.create_task(state.drain())
        await asyncio.sleep(0.05)
        await drain.Drain(json_app(0))(late.scope, late.receive, late.send)
        await asyncio.gather(*tasks)
        return await result

    result = run(scenario())
    assert result == {"in_flight": 3, "finished": 1, "ended": 2, "cut": 0, "left": 0}
    assert short_stream.body().endswith(b"data: 2\n\ndata: [DONE]\n\n")
    events = [e for e in long_stream.body().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["error"]["code"] == "shutting_down"
    assert events[0] == "data: 0" and long_stream.sent[-1].get("more_body") is not True
    assert long_json.status() == 503 and json.loads(long_json.body())["error"]["code"] == "shutting_down"
    assert late.status() == 503 and (b"retry-after", b"1") in late.sent[0]["headers"]
    assert not state.inflight


def test_drain_counts_requests_cut_under_it_as_cut_not_finished(state):
    """A second signal stops the server under the drain: its requests leave without a whole answer."""
    streams = [Client() for _ in range(3)]

    async def scenario():
        tasks = [asyncio.create_task(drain.Drain(sse_app(1000, 0.05))(c.scope, c.receive, c.send)) for c in streams]
        await asyncio.sleep(0.1)
        result = asyncio.create_task(state.drain(timeout_s=5))
        await asyncio.sleep(0.1)
        for t in tasks:  # what a server stopping under its connections does to them
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return await result

    assert run(scenario()) == {"in_flight": 3, "finished": 0, "ended": 0, "cut": 3, "left": 0}


def test_drain_leaves_health_and_metrics_alone(state):
    state.draining = True
    c = Client(path="/health", method="GET")
    run(drain.Drain(json_app(0))(c.scope, c.receive, c.send))
    assert c.status() == 200


def test_cancellations_are_recognised():
    from ray.exceptions import TaskCancelledError

    assert drain.cancelled(TaskCancelledError()) and drain.cancelled(asyncio.CancelledError())
    assert not drain.cancelled(RuntimeError("boom"))


def details(replicas, status="HEALTHY", message=""):
    return {"applications": {"app": {"deployments": {"Model_a": {
        "status": status, "message": message, "replicas": replicas}}}}}


def test_readiness_follows_running_replicas_not_load():
    h = health.Health("app", {"a": "Model_a"}, {}, {"a": 512})
    assert h.report(False)[0] == 503 and h.report(False)[1]["models"] == {"a": "loading"}  # before any poll
    run(_poll(h, details([{"state": "STARTING", "node_id": "n1", "node_ip": "10.0.0.1"}], "UPDATING")))
    assert h.report(False)[0] == 503 and h.states == {"a": "loading"}
    run(_poll(h, details([{"state": "RUNNING", "node_id": "n1" * 10, "node_ip": "10.0.0.1"},
                          {"state": "STARTING", "node_id": "n2", "node_ip": "10.0.0.2"}], "UNHEALTHY")))
    code, body = h.report(False)
    assert code == 200 and body["models"] == {"a": "ready"} and body["replicas"]["a"]["other"] == {"STARTING": 1}
    assert body["replicas"]["a"]["running"] == [f"{('n1' * 10)[:12]}@10.0.0.1"]
    assert h.report(True) == (503, {**body, "status": "draining"})
    run(_poll(h, details([], "DEPLOY_FAILED", "engine failed: bad manifest")))
    assert h.report(False)[0] == 503 and h.states["a"].startswith("not ready (DEPLOY_FAILED: engine failed")


async def _poll(h, d):
    h.poll_once(d)


def test_gate_refuses_a_huge_head_and_a_slow_body(monkeypatch):
    monkeypatch.setattr(gate, "SETTINGS", gate.GateSettings(max_header_bytes=2048, body_timeout_s=0.2))
    big = Client(headers=[(b"x-junk", b"a" * 4096)])
    run(gate.Gate(json_app(0))(big.scope, big.receive, big.send))
    assert big.status() == 431 and json.loads(big.body())["error"]["code"] == "request_header_too_large"
    slow = Client(body_parts=(b"{", b"}"), part_delay=0.5)
    run(gate.Gate(json_app(0))(slow.scope, slow.receive, slow.send))
    assert slow.status() == 408 and json.loads(slow.body())["error"]["code"] == "request_timeout"
    ok = Client(headers=[(b"x-fine", b"a" * 100)], body_parts=(b"{", b"}"), part_delay=0.01)
    run(gate.Gate(json_app(0))(ok.scope, ok.receive, ok.send))
    assert ok.status() == 200


def fake_spec(**kw):
    return {"name": "m", "path": ".", "engine": "doubles.fake_engine:FakeEngine", **kw}


def test_autoscaling_target_defaults_to_max_batch():
    m = ModelSpec(**fake_spec(max_batch=16, min_replicas=1, max_replicas=3, upscale_delay_s=5, downscale_delay_s=60,
                              autoscaling_options={"look_back_period_s": 2}))
    assert autoscaling_config(m) == {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 16.0,
                                     "upscale_delay_s": 5, "downscale_delay_s": 60, "look_back_period_s": 2}
    assert ModelSpec(**fake_spec(max_batch=4, target_ongoing_requests=3)).autoscaling_target == 3
    from serve_app.app import deployment_options, ops_settings

    args = AppArgs(models=[fake_spec(max_batch=4, max_replicas=2)], graceful_shutdown_timeout_s=7)
    assert deployment_options(args.models[0], args)["autoscaling_config"]["target_ongoing_requests"] == 4.0
    assert ops_settings(args)["drain_timeout_s"] == 7


def test_a_replica_names_its_node_and_the_mismatched_manifest_field(tiny_dirs, tmp_path):
    """A node whose copy of the artifacts was built for another max_batch: the replica refuses to start,
    naming the node and the field (the real manifest check, on the cpu backend)."""
    import socket

    from neuron_workers.artifacts.manifest import Manifest, config_hash, installed_versions
    from neuron_workers.errors import UserError
    from neuron_workers.model.loader import load_model
    from serve_app.replica.model_server import ModelServer

    d = tiny_dirs["gemma4-e2b-tiny"]
    info = load_model(d, with_weights=False).info
    Manifest("cpu", config_hash(info.text_config), info.model_type, 1, 2, 64, [64], "float32", {},
             installed_versions("cpu")).write(tmp_path)
    spec = {"name": "e2b", "path": str(d), "backend": "cpu", "artifacts": str(tmp_path), "max_context": 64,
            "max_batch": 4}
    with pytest.raises(UserError, match=rf"'e2b' cannot start on node {socket.gethostname()}.*max_batch=2"):
        ModelServer(spec)
    with pytest.raises(UserError, match=rf"on node {socket.gethostname()}.*no manifest.json"):
        ModelServer({**spec, "artifacts": str(tmp_path / "missing")})


def test_the_router_holds_more_than_every_model_can():
    """inf2.yaml's models can hold 688 requests (running, waiting, queued): the router's limit is above that.
    (E2B: 4 replicas x 2 x max_batch 32 + 128 queued; E4B: 2 x 2 x 32 + 128; 12B: 2 x 2 x 4 + 32.)"""
    from pathlib import Path

    import yaml

    from serve_app.app import PROBE_HEADROOM, router_ongoing_limit

    cfg = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "inf2.yaml").read_text())
    args = AppArgs(**cfg["applications"][0]["args"])
    assert router_ongoing_limit(args) == 4 * 64 + 128 + 2 * 64 + 128 + 2 * 8 + 32 + PROBE_HEADROOM
    assert router_ongoing_limit(AppArgs(models=[fake_spec()])) == 256  # small configs keep the default


def test_a_proxy_that_dies_under_a_request_ends_it_quietly(state):
    """Plain `serve run` kills Ray's HTTP proxy first on Ctrl-C: the request's `receive` raises; that is one INFO
    line, not our traceback and Serve's. Any other actor's death still propagates."""
    from ray.exceptions import RayActorError

    def dying(name):
        async def app(scope, receive, send):
            raise RayActorError(error_msg=f"The actor died unexpectedly. class_name: {name}")
        return app

    c = Client()
    run(drain.Drain(dying("ProxyActor"))(c.scope, c.receive, c.send))
    assert c.sent == [] and not state.inflight
    with pytest.raises(RayActorError):
        run(drain.Drain(dying("ServeReplica:x:Model_m"))(c.scope, c.receive, c.send))


def test_engine_totals_become_counter_increments(monkeypatch):
    """Prefix-cache and speculative-decoding totals ride on each step's stats; the replica counts what they
    grew (and starts again from 0 when a restarted engine process reports smaller totals)."""
    from types import SimpleNamespace

    from neuron_workers.engine.loop import StepStats
    from serve_app.ops import metrics as m

    class Metric:
        def __init__(self, name, *a, **k):
            self.name, self.total = name, 0

        def inc(self, v=1, tags=None):
            self.total += v

        def set_default_tags(self, tags):
            pass

        observe = set = inc

    monkeypatch.setattr(m, "metrics", SimpleNamespace(Counter=Metric, Gauge=Metric, Histogram=Metric))
    sm = m.ServerMetrics("e2b")
    for stats in (StepStats(1, 0, 1, 4, 100, 60, 8, 5), StepStats(1, 0, 1, 4, 150, 100, 12, 6),
                  StepStats(0, 0, 0, 4, 20, 0, 3, 1)):  # the last: a restarted engine
        sm.step(stats, (1,))
    assert (sm.prefix_query.total, sm.prefix_hit.total) == (170, 100)
    assert (sm.spec_drafts.total, sm.spec_accepted.total) == (15, 7)
    assert sm.prefix_hit.name == "gemma4_prefix_cache_hit_tokens"
    assert sm.spec_accepted.name == "gemma4_spec_decode_num_accepted_tokens"
