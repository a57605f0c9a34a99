"""Readiness under load (session cluster, fake engine): a model whose slots and queue are full is busy, not
down. Every probe sent while 64 requests hammer a model that holds 4 says 200 "ready", while the
requests themselves get 200 or 503 `overloaded`."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from conftest import deploy

pytestmark = pytest.mark.slow


def test_health_says_ready_for_a_loaded_model_however_busy(serve_url):
    from ray import serve

    model = {"name": "busy", "path": ".", "engine": "doubles.fake_engine:FakeEngine",
             "engine_options": {"step_s": 0.05}, "max_batch": 2, "max_ongoing_requests": 2, "max_queued_requests": 2}
    url = deploy({"models": [model], "graceful_shutdown_wait_loop_s": 0}, "busy", serve_url)
    base = url.removesuffix("/v1")
    try:
        deadline = time.time() + 30
        while httpx.get(f"{base}/health").status_code != 200 and time.time() < deadline:
            time.sleep(0.1)
        async def scenario():
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as h:
                body = {"model": "busy", "prompt": "x", "max_tokens": 40, "ignore_eos": True}
                load = [asyncio.create_task(h.post(f"{url}/completions", json=body)) for _ in range(64)]
                await asyncio.sleep(0.5)

                async def probe():
                    t = time.perf_counter()
                    r = await h.get(f"{base}/health")
                    return r, time.perf_counter() - t

                probes = []
                for _ in range(5):  # five rounds of eight concurrent probes while the load runs
                    probes += await asyncio.gather(*(probe() for _ in range(8)))
                    await asyncio.sleep(0.2)
                live = await h.get(f"{base}/health/live")
                return await asyncio.gather(*load), probes, live

        load, probes, live = asyncio.run(scenario())
        codes = [r.status_code for r in load]
        assert set(codes) <= {200, 503} and codes.count(503) >= 32, codes  # it really was over capacity
        assert all(r.json()["error"]["code"] == "overloaded" for r in load if r.status_code == 503)
        assert [r.status_code for r, _ in probes] == [200] * 40, [r.text for r, _ in probes if r.status_code != 200][:3]
        assert all(r.json()["models"] == {"busy": "ready"} for r, _ in probes)
        assert live.status_code == 200 and live.json()["status"] == "alive"
        print(f"probe latency under load: max {max(t for _, t in probes) * 1e3:.0f} ms")
    finally:
        serve.delete("busy")
