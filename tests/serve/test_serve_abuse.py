"""The server under abuse and faults (real Ray cluster, real HTTP; the fake engine is the real Engine over
a backend that sleeps per step, so pacing and cancellation are observable without a model):
huge bodies, API keys, strict validation, errors mid-stream, a replica killed under load, and metrics
that add up."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from conftest import deploy

pytestmark = pytest.mark.slow
KEY = "sk-test-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def fake(name, step_s=0.02, **kw):
    return {"name": name, "path": ".", "engine": "doubles.fake_engine:FakeEngine", "engine_options": {"step_s": step_s},
            "max_context": 4096, **kw}


@pytest.fixture(scope="module")
def app(serve_url):
    from ray import serve

    url = deploy({"models": [fake("a"), fake("b"), fake("counted")], "api_keys": [KEY],
                  "max_request_bytes": 1024 * 1024, "graceful_shutdown_wait_loop_s": 0}, "abuse", serve_url)
    yield url
    serve.delete("abuse")


def sse_events(lines):
    return [json.loads(x[6:]) if x != "data: [DONE]" else "[DONE]" for x in lines if x.startswith("data: ")]


def test_api_key(app):
    body = {"model": "a", "prompt": "hi", "max_tokens": 2}
    with httpx.Client(timeout=30) as h:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = h.post(f"{app}/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", headers
        assert h.get(f"{app}/models").status_code == 401
        assert h.post(f"{app}/completions", json=body, headers=AUTH).status_code == 200
        assert h.get(f"{app}/models", headers=AUTH).status_code == 200
        assert h.get(app.removesuffix("/v1") + "/health").status_code == 200  # open


def test_huge_body_is_refused_fast_while_a_stream_keeps_its_pace(app):
    body = {"model": "a", "prompt": "Hello", "max_tokens": 150, "ignore_eos": True, "stream": True}
    huge = json.dumps({"model": "a", "prompt": "x" * (10 * 1024 * 1024)}).encode()

    async def stream():
        arrivals, chars = [], 0
        async with httpx.AsyncClient(timeout=60) as h:
            async with h.stream("POST", f"{app}/completions", json=body, headers=AUTH) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.perf_counter())
                        chars += sum(len(c["text"]) for c in json.loads(line[6:])["choices"])
        return arrivals, chars

    async def attack():
        await asyncio.sleep(0.8)
        async with httpx.AsyncClient(timeout=60) as h:
            t = time.perf_counter()
            r = await h.post(f"{app}/completions", content=huge, headers={**AUTH, "content-type": "application/json"})
            took = time.perf_counter() - t
            health = await h.get(app.removesuffix("/v1") + "/health")
        return r, took, health.status_code

    async def both():
        return await asyncio.gather(stream(), attack())

    (arrivals, chars), (r, took, health) = asyncio.run(both())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large" and took < 2.0
    assert health == 200
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    # a token (one character here) every ~20 ms, sent at most every 40 ms: no stall while the 10 MB arrived
    assert chars == 150 and len(arrivals) >= 30 and max(gaps) < 0.5, (len(arrivals), max(gaps))


def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing(app):
    """Under the body limit but far over the context: refused from its length alone (the fake model's
    context is 4096 tokens and its tokens are one character long)."""
    with httpx.Client(timeout=30) as h:
        t = time.perf_counter()
        r = h.post(f"{app}/completions", json={"model": "a", "prompt": "y" * 900_000}, headers=AUTH)
        took = time.perf_counter() - t
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "900000 characters" in err["message"] and took < 2.0


BAD = [
    ({"prompt": "a\ud800b"}, "prompt"),
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages"),
    ({"prompt": "hi", "seed": 2**64}, "seed"),
    ({"prompt": "hi", "seed": 2**64, "stream": True}, "seed"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ({"prompt": "hi", "temperature": "0.5"}, "temperature"),
    ({"prompt": "hi", "stop": ["a\udfffb"]}, "stop"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "strng"}}}}, "response_format"),
    ({"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),  # scoring only: needs echo
    ({"prompt": "hi", "echo": True, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": "hi", "best_of": 2}, "best_of"),
    ({"prompt": "hi", "suffix": "x"}, "suffix"),
    ({"prompt": "hi", "logit_bias": {"05": 10}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"4000000": 1}}, "logit_bias"),  # past the vocabulary: the engine says so
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
]


def test_bad_inputs_name_their_param_and_the_server_still_serves(app):
    with httpx.Client(timeout=30) as h:
        for extra, param in BAD:
            path = "chat/completions" if "messages" in extra else "completions"
            raw = json.dumps({"model": "a", **extra}).encode()  # lone surrogates survive json.dumps as \\ud800
            r = h.post(f"{app}/{path}", content=raw, headers={**AUTH, "content-type": "application/json"})
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["param"] == param, (extra, r.text)
        ok = h.post(f"{app}/completions", json={"model": "a", "prompt": "hi", "max_tokens": 3, "seed": 2**64 - 1,
                                                "temperature": 1, "user": "u1", "frequency_penalty": 1,
                                                "presence_penalty": 0.5, "repetition_penalty": 1.1,
                                                "logit_bias": {"20": 100}}, headers=AUTH)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        assert ok.json()["choices"][0]["text"] == "kkk"  # the bias forces id 20 (the character tokenizer's "k")


def test_killed_replica_gives_503_or_an_error_event_and_comes_back(app, serve_url):
    import ray

    async def one(h, i):
        body = {"model": "b", "prompt": f"job {i}", "max_tokens": 400, "ignore_eos": True, "stream": i % 2 == 0}
        if body["stream"]:
            async with h.stream("POST", f"{app}/completions", json=body, headers=AUTH) as r:
                return r.status_code, sse_events([line async for line in r.aiter_lines()])
        r = await h.post(f"{app}/completions", json=body, headers=AUTH)
        return r.status_code, r.json()

    async def other(h):
        r = await h.post(f"{app}/completions", json={"model": "a", "prompt": "x", "max_tokens": 60}, headers=AUTH)
        return r.status_code

    async def kill_soon():
        await asyncio.sleep(1.0)
        names = ray.util.list_named_actors(all_namespaces=True)
        victim = next(a for a in names if a["name"].startswith("SERVE_REPLICA::abuse#Model_b#"))
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)

    async def run():
        async with httpx.AsyncClient(timeout=120) as h:
            return await asyncio.gather(*(one(h, i) for i in range(6)), other(h), kill_soon())

    *results, other_status, _ = asyncio.run(run())
    assert other_status == 200  # the other model lost nothing
    for status, body in results:
        if isinstance(body, list):  # a stream: it started, so it must end with an error event and [DONE]
            assert status == 200 and body[-1] == "[DONE]" and body[-2]["error"]["code"] == "replica_unavailable"
        else:
            assert status == 503 and body["error"]["code"] == "replica_unavailable", body
    deadline, status = time.time() + 90, None
    with httpx.Client(timeout=30) as h:
        while time.time() < deadline and status != 200:
            status = h.post(f"{app}/completions", json={"model": "b", "prompt": "x", "max_tokens": 2},
                            headers=AUTH).status_code
            time.sleep(1)
    assert status == 200  # Serve restarted the replica


def metric_counts(text: str, model: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("ray_gemma4_request_finished_total{") and f'model="{model}"' in line:
            reason = line.split('finished_reason="')[1].split('"')[0]
            out[reason] = out.get(reason, 0) + float(line.rsplit(" ", 1)[1])
    return out


def test_metrics_add_up_by_finish_reason(app):
    async def run():
        async with httpx.AsyncClient(timeout=60) as h:
            async def send(body):
                return await h.post(f"{app}/completions", json={"model": "counted", **body}, headers=AUTH)

            async def abandon(body):  # a client that gives up mid-stream
                async with h.stream("POST", f"{app}/completions", json={"model": "counted", **body},
                                     headers=AUTH) as r:
                    async for _ in r.aiter_lines():
                        break

            await asyncio.gather(*(send({"prompt": "hi", "max_tokens": 5}) for _ in range(3)),  # length
                                 send({"prompt": [2, 99999], "max_tokens": 5}),  # error: bad token id
                                 send({"prompt": "hi", "max_tokens": 5000}),  # error: over the context
                                 send({"prompt": "hello", "max_tokens": 30, "stop": ["l"]}),  # stop
                                 *(abandon({"prompt": "x", "max_tokens": 500, "stream": True}) for _ in range(2)))

    asyncio.run(run())
    want = {"length": 3, "error": 2, "stop": 1, "abort": 2}
    deadline, got = time.time() + 60, {}
    with httpx.Client(timeout=30) as h:
        while time.time() < deadline and got != want:
            got = metric_counts(h.get(app.removesuffix("/v1") + "/metrics").text, "counted")
            time.sleep(1)
        assert got == want
        served, everything = (h.get(app.removesuffix("/v1") + q).text for q in ("/metrics", "/metrics?all=true"))
    names = {line.split("{")[0].split(" ")[0] for line in served.splitlines() if not line.startswith("#")}
    assert names and all(n.startswith(("ray_gemma4_", "ray_serve_")) for n in names), names
    assert "ray_gemma4_request_finished_total" in everything and len(everything) > 2 * len(served)


def heavy_body(model: str) -> dict:
    """A chat whose `response_format` schema takes the router about a second to check and compile (900
    object properties of five fields each: under the schema limits, so it is fully checked)."""
    inner = {"type": "object", "properties": {f"q{j}": {"type": "string", "maxLength": 8} for j in range(5)},
             "required": ["q0"]}
    schema = {"type": "object", "properties": {f"p{i}": inner for i in range(900)}}
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}}


def test_schema_work_never_delays_health_or_another_model(app):
    """Schemas are checked off the router's event loop: while four heavy schemas are being checked (seconds
    of CPU in all), `/health` and a short request to another model answer in a fraction of that (on the
    event loop they took 6 s)."""
    base = app.removesuffix("/v1")

    async def main():
        async with httpx.AsyncClient(timeout=120) as h:
            t0 = time.perf_counter()
            heavy = [asyncio.create_task(h.post(f"{app}/chat/completions", json=heavy_body("a"), headers=AUTH))
                     for _ in range(4)]
            await asyncio.sleep(0.3)  # the router is busy with them now
            t = time.perf_counter()
            health = await h.get(f"{base}/health")
            health_s = time.perf_counter() - t
            t = time.perf_counter()
            other = await h.post(f"{app}/completions", json={"model": "b", "prompt": "hi", "max_tokens": 2},
                                 headers=AUTH)
            other_s = time.perf_counter() - t
            asked = time.perf_counter() - t0
            answers = await asyncio.gather(*heavy)
            return health, health_s, other, other_s, asked, answers, time.perf_counter() - t0

    health, health_s, other, other_s, asked, answers, heavy_s = asyncio.run(main())
    assert health.status_code == 200 and other.status_code == 200
    assert all(r.status_code in (200, 400) for r in answers), [r.text[:200] for r in answers]
    assert heavy_s > asked + 0.3, "the heavy schemas were done before the probes: the test measured nothing"
    assert health_s < 1.0 and other_s < 2.0, (health_s, other_s, heavy_s)  # on the event loop: 6 s each
