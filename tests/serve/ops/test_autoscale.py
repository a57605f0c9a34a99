"""Autoscaling sized to batching, on the session cluster (4 fake NeuronCores): a burst over max_batch per
replica adds a replica; when the load falls, scaling down drains the removed replica: every request,
including those running on it, finishes whole."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from conftest import deploy

pytestmark = pytest.mark.slow
TOKENS = 100


def states(app="auto", dep="Model_a") -> dict:
    from ray import serve

    d = serve.status().applications.get(app)
    return dict(d.deployments[dep].replica_states) if d and dep in d.deployments else {}


def running() -> int:
    return states().get("RUNNING", 0)


IN_FLIGHT = [0]


async def stream(h, url, i):
    body = {"model": "a", "prompt": f"job {i}", "max_tokens": TOKENS, "ignore_eos": True, "stream": True}
    IN_FLIGHT[0] += 1
    try:
        async with h.stream("POST", f"{url}/completions", json=body) as r:
            events = [x[6:] for x in [line async for line in r.aiter_lines()] if x.startswith("data: ")]
    finally:
        IN_FLIGHT[0] -= 1
    assert r.status_code == 200 and events[-1] == "[DONE]", events[-2:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks[-1]
    return sum(len(c["choices"][0]["text"]) for c in chunks)


def test_a_burst_adds_a_replica_and_scaling_down_cuts_nothing(serve_url):
    from ray import serve

    model = {"name": "a", "path": ".", "engine": "doubles.fake_engine:FakeEngine", "engine_options": {"step_s": 0.04},
             "backend": "neuron", "tp": 1, "artifacts": "unused", "max_batch": 2, "max_context": 512,
             "min_replicas": 1, "max_replicas": 2, "upscale_delay_s": 1, "downscale_delay_s": 3,
             "autoscaling_options": {"metrics_interval_s": 0.5, "look_back_period_s": 1}}
    url = deploy({"models": [model], "graceful_shutdown_wait_loop_s": 0.2}, "auto", serve_url)
    try:
        assert running() == 1
        seen, stopping_under_load = [], []

        async def watch(stop):
            while not stop.is_set():
                now = await asyncio.to_thread(states)
                seen.append(now.get("RUNNING", 0))
                if now.get("STOPPING") and IN_FLIGHT[0]:
                    stopping_under_load.append(IN_FLIGHT[0])
                await asyncio.sleep(0.3)

        async def scenario():
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(stop))
            async with httpx.AsyncClient(timeout=120) as h:
                burst, deadline = [], time.monotonic() + 90
                while 2 not in seen and time.monotonic() < deadline:  # bursts of 4x one replica's slots, until a
                    # second replica runs (on a loaded box one burst can end before it has started)
                    burst += await asyncio.gather(*(stream(h, url, i) for i in range(8)))
                assert 2 in seen, seen
                # the load falls to one replica's worth: two streams at a time until one replica is left
                done, deadline, i = [], time.monotonic() + 90, 100
                while time.monotonic() < deadline and not (seen[-1] == 1 and seen[-5:].count(1) == 5):
                    done += await asyncio.gather(stream(h, url, i), stream(h, url, i + 1))
                    i += 2
            stop.set()
            await watcher
            return burst, done

        burst, after = asyncio.run(scenario())
        assert burst and set(burst) == {TOKENS} and after and set(after) == {TOKENS}
        assert seen[-1] == 1 and 2 in seen, seen
        assert stopping_under_load  # a replica was stopped while streams were running: none was cut
        deadline = time.time() + 60
        while states() != {"RUNNING": 1} and time.time() < deadline:
            time.sleep(0.5)
        assert states() == {"RUNNING": 1}
    finally:
        serve.delete("auto")
