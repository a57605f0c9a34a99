"""Two Ray nodes on this machine (`ray start` twice, both on 127.0.0.1, 2 fake NeuronCores each), the
server started on the head with `python -m serve_app.run`, the fake engine standing in on the neuron
backend. A model whose 2 replicas need 4 cores (one node has 2) is placed on both nodes; every model
answers through the head's one HTTP port; killing the second node under traffic gives its in-flight
requests a 503 `replica_unavailable` or the stream error event (never a 500, never a silent cut), the
head keeps serving, and the lost replica comes back when the node does.

Run alone: `python -m pytest -q -m multinode` (about 2-3 minutes on 2 cores)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import pytest

from localcluster import ROOT, env, free_port, ray_head, ray_worker, serve_run, wait_ready, write_config

pytestmark = [pytest.mark.slow, pytest.mark.multinode]
HEAD = {"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}}  # the router and `side` stay on the head


def fake(name, **kw):
    return {"name": name, "path": ".", "engine": "doubles.fake_engine:FakeEngine", "max_context": 2048,
            "engine_options": {"step_s": 0.05}, "max_batch": 8, **kw}


def nodes_of(body, model):
    return {r.split("@")[0] for r in body["replicas"][model]["running"]}


def on_two_nodes(body):
    return len(nodes_of(body, "wide")) == 2 and body["replicas"]["side"]["running"]


async def one(h, url, model, n, stream, i):
    body = {"model": model, "prompt": f"job {i}", "max_tokens": n, "ignore_eos": True, "stream": stream}
    if not stream:
        r = await h.post(f"{url}/v1/completions", json=body)
        return r.status_code, r.json()
    async with h.stream("POST", f"{url}/v1/completions", json=body) as r:
        return r.status_code, [json.loads(x[6:]) if x != "data: [DONE]" else "[DONE]"
                               async for x in r.aiter_lines() if x.startswith("data: ")]


def outcome(status, body, n):
    """'ok' for a whole answer, 'lost' for the replica-unavailable answer; anything else fails the test."""
    if isinstance(body, list):
        assert status == 200 and body[-1] == "[DONE]", body[-3:]  # a stream always ends in shape
        if "error" in body[-2]:
            assert body[-2]["error"]["code"] == "replica_unavailable", body[-2]
            return "lost"
        assert sum(len(e["choices"][0]["text"]) for e in body[:-1]) == n
        return "ok"
    if status == 503:
        assert body["error"]["code"] == "replica_unavailable", body
        return "lost"
    assert status == 200 and body["usage"]["completion_tokens"] == n, (status, body)
    return "ok"


def test_replicas_across_two_nodes_survive_losing_one(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    head, gcs = ray_head(tmp_path, {"neuron_cores": 2})
    wide = fake("wide", backend="neuron", tp=2, artifacts="unused", min_replicas=2, max_replicas=2)
    cfg = write_config(tmp_path, port, {"models": [wide, fake("side")], "graceful_shutdown_wait_loop_s": 0.2,
                                        "graceful_shutdown_timeout_s": 5},
                       deployments=[{"name": "Router", "ray_actor_options": HEAD},
                                    {"name": "Model_side", "ray_actor_options": HEAD}])
    server = worker = None
    try:
        worker = ray_worker(tmp_path, "worker", {"neuron_cores": 2}, gcs)
        time.sleep(5)  # let the worker's resources reach the GCS before the builder counts the cluster's cores
        server = serve_run(tmp_path, cfg, gcs)
        before = wait_ready(url, 240, server, want=on_two_nodes, others=[head, worker])
        head_node = next(iter(nodes_of(before, "side")))

        async def traffic():
            async with httpx.AsyncClient(timeout=120) as h:
                assert [s for s, _ in await asyncio.gather(one(h, url, "wide", 4, False, 0),
                                                           one(h, url, "side", 4, True, 1))] == [200, 200]
                jobs = [asyncio.create_task(one(h, url, "wide", 80, i % 2 == 0, i)) for i in range(8)]
                side = asyncio.create_task(one(h, url, "side", 80, True, 99))
                await asyncio.sleep(1.5)  # every job is generating, on both nodes
                worker.kill_group()  # the second machine is gone
                return await asyncio.gather(*jobs), await side

        results, side = asyncio.run(traffic())
        outcomes = [outcome(s, b, 80) for s, b in results]
        assert outcomes.count("ok") >= 1 and outcomes.count("lost") >= 1, outcomes  # both nodes had work
        assert outcome(*side, 80) == "ok"

        deadline, streak = time.time() + 90, 0  # the head keeps serving `wide` on its own replica
        with httpx.Client(timeout=30) as h:
            while time.time() < deadline and streak < 5:
                r = h.post(f"{url}/v1/completions", json={"model": "wide", "prompt": "x", "max_tokens": 3})
                assert r.status_code in (200, 503), r.text
                streak = streak + 1 if r.status_code == 200 else 0
                time.sleep(0.2)
            assert streak == 5
        # Serve notices the lost replica (GCS marks the node dead); the model stays ready on the head
        lost = wait_ready(url, 120, server, others=[head], want=lambda b: nodes_of(b, "wide") == {head_node})
        assert lost["models"]["wide"] == "ready"

        worker.stop()  # already dead: close its log, remove its session directory
        worker = ray_worker(tmp_path, "worker2", {"neuron_cores": 2}, gcs)  # the machine returns
        after = wait_ready(url, 240, server, want=on_two_nodes, others=[head, worker])
        assert head_node in nodes_of(after, "wide") and nodes_of(after, "wide") != nodes_of(before, "wide")

        # a script drains a running cluster: `python -m serve_app.run --drain --address ...`
        out = subprocess.run([sys.executable, "-m", "serve_app.run", "--drain", "--address", f"127.0.0.1:{gcs}"],
                             capture_output=True, text=True, timeout=120, env=env(), cwd=ROOT)
        assert out.returncode == 0 and "drain: application 'gemma4': {'in_flight': 0" in out.stderr, out.stderr
        assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "draining"
    finally:
        if server is not None:
            server.stop()
        if worker is not None:
            worker.stop()
        head.stop()
