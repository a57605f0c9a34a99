"""The Ray Serve app on CPU: a real cluster, the three tiny checkpoints on the CPU backend, HTTP and the
official `openai` client. Plus a fake-engine app for back-pressure and NeuronCore pinning."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.factory import build_engine

from conftest import deploy

pytestmark = pytest.mark.slow  # loads models or starts a Ray cluster


MODELS = {"e2b": "gemma4-e2b-tiny", "e4b": "gemma4-e4b-tiny", "12b": "gemma4-12b-tiny"}
CTX = 512


@pytest.fixture(scope="module")
def tiny_app(serve_url, tiny_dirs):
    models = [{"name": name, "path": str(tiny_dirs[d]), "backend": "cpu", "max_context": CTX,
               "max_ongoing_requests": 8, "max_queued_requests": 32} for name, d in MODELS.items()]
    url = deploy({"models": models, "accelerator_resource": "", "graceful_shutdown_wait_loop_s": 0}, "tiny", serve_url)
    yield url
    from ray import serve

    serve.delete("tiny")


@pytest.fixture(scope="module")
def engines(tiny_dirs):
    """The same checkpoints driven in-process: what each HTTP answer must equal."""
    return {name: build_engine(EngineConfig(model=str(tiny_dirs[d]), max_context=CTX, max_batch=1))
            for name, d in MODELS.items()}


def reference(engine, ids, n):
    """(text, finish_reason, tokens) of greedy generation in-process."""
    events = list(engine.generate(ids, SamplingParams(max_tokens=n)))
    return "".join(e.text for e in events), events[-1].finish_reason, len(events)


def reference_text(engine, ids, n):
    return reference(engine, ids, n)[0]


def reference_chat(engine, ids, n):
    """(content, finish_reason, tokens) of a greedy chat in-process: the text with its control tokens, through
    the router's output parser (with thinking off a thought channel the model opens is not content)."""
    from serve_app.openai.chat_output import ChatOutput

    events = list(engine.run_all([engine.new_sequence(ids, SamplingParams(max_tokens=n), skip_special_tokens=False)]))
    out = ChatOutput([], False)
    out.feed("".join(e.text for e in events))
    out.flush()
    return out.message()["content"], events[-1].finish_reason, len(events)


def client(url):
    from openai import OpenAI

    return OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def stats(model):
    from ray import serve

    return serve.get_deployment_handle(f"Model_{model}", "tiny").get_stats.remote().result()


def test_openai_client_chat_and_completions(tiny_app, engines):
    c = client(tiny_app)
    assert sorted(m.id for m in c.models.list().data) == sorted(MODELS)
    assert c.models.retrieve("e2b").id == "e2b"  # GET /v1/models/{id}
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    for name, eng in engines.items():
        want, finish, n = reference_chat(eng, eng.encode_chat(msgs), 20)
        r = c.chat.completions.create(model=name, messages=msgs, max_tokens=20, temperature=0)
        assert r.choices[0].message.content == want and r.choices[0].finish_reason == finish
        assert r.usage.prompt_tokens == len(eng.encode_chat(msgs)) and r.usage.completion_tokens == n
        stream = c.chat.completions.create(model=name, messages=msgs, max_tokens=20, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
        assert chunks[-1].usage.completion_tokens == n
        prompt_ids = eng.encode("Once upon a time")
        want = reference_text(eng, prompt_ids, 12)
        r = c.completions.create(model=name, prompt="Once upon a time", max_tokens=12, temperature=0)
        assert r.choices[0].text == want and r.usage.prompt_tokens == len(prompt_ids)
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model=name, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True))
        assert streamed == want
    outputs = {name: c.completions.create(model=name, prompt=[2, 40, 41, 42], max_tokens=8, temperature=0)
               .choices[0].text for name in MODELS}
    assert len(set(outputs.values())) == 3  # each name reached its own model


def test_echo_with_logprobs_as_lm_eval_sends_it(tiny_app, engines):
    """lm-evaluation-harness's loglikelihood request (token ids, echo, logprobs 1, max_tokens 1), the official
    client's echo, max_tokens 0 (score only), vLLM's prompt_logprobs, streamed echo, and the refusals."""
    from neuron_workers.engine.params import SamplingParams as SP

    eng, ids = engines["e4b"], [2] + [(7 * i + 3) % 400 + 20 for i in range(30)]
    seq = eng.new_sequence(ids, SP(max_tokens=1), prompt_logprobs=1)
    want = [None] + [lp for lp, _, _ in list(eng.run_all([seq]))[0].prompt_logprobs[1:]]
    with httpx.Client(timeout=60) as h:
        body = {"model": "e4b", "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True,
                "seed": 1234}
        r = h.post(f"{tiny_app}/completions", json=body).json()
        lp = r["choices"][0]["logprobs"]
        assert lp["token_logprobs"][:len(ids)] == pytest.approx(want) and len(lp["token_logprobs"]) == len(ids) + 1
        assert lp["top_logprobs"][0] is None and all(len(t) == 1 for t in lp["top_logprobs"][1:])
        assert r["choices"][0]["text"].startswith("".join(lp["tokens"][:len(ids)]))
        assert r["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
        r = h.post(f"{tiny_app}/completions", json={**body, "max_tokens": 0}).json()
        assert len(r["choices"][0]["logprobs"]["tokens"]) == len(ids) and r["usage"]["completion_tokens"] == 0
        r = h.post(f"{tiny_app}/completions", json={"model": "e4b", "prompt": ids, "max_tokens": 2,
                                                    "prompt_logprobs": 2}).json()
        pl = r["choices"][0]["prompt_logprobs"]
        assert pl[0] is None and len(pl) == len(ids) and all(str(t) in d for t, d in zip(ids[1:], pl[1:]))
        assert [d[str(t)]["logprob"] for t, d in zip(ids[1:], pl[1:])] == pytest.approx(want[1:])
        streamed = h.post(f"{tiny_app}/completions", json={"model": "e4b", "prompt": "Once upon a time",
                                                           "max_tokens": 4, "echo": True, "stream": True}).text
        chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).startswith("Once upon a time")
        for bad, param in (({"max_tokens": 0}, "max_tokens"), ({"prompt_logprobs": 21}, "prompt_logprobs")):
            r = h.post(f"{tiny_app}/completions", json={"model": "e4b", "prompt": "hi", **bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        r = h.post(f"{tiny_app}/chat/completions", json={"model": "e4b", "echo": True,
                                                         "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
    r = client(tiny_app).completions.create(model="e4b", prompt="Once upon a time", max_tokens=3, temperature=0,
                                            echo=True, logprobs=2)
    assert r.choices[0].text.startswith("Once upon a time") and r.choices[0].logprobs.token_logprobs[0] is None


def test_seeded_sampling_and_stop_strings(tiny_app, engines):
    c = client(tiny_app)
    kw = dict(model="e4b", prompt="Hello", max_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    a, b = (c.completions.create(**kw).choices[0].text for _ in range(2))
    assert a == b
    full = c.completions.create(model="e2b", prompt="Hello", max_tokens=30, temperature=0).choices[0].text
    stop = full[5:8]
    r = c.completions.create(model="e2b", prompt="Hello", max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"


BAD = [
    ("chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found"),
    ("chat/completions", {"model": "e2b", "messages": []}, 400, "invalid_value"),
    ("chat/completions", {"model": "e2b", "messages": "hi"}, 400, "invalid_value"),
    ("chat/completions", {"model": "e2b", "messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": "hi", "max_tokens": -1}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": "hi", "temperature": 5}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": "hi", "temperature": "hot"}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": "hi", "top_p": 0}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": "hi", "n": 9}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": 5}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": []}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": [2, 99999]}, 400, "invalid_request"),
    ("completions", {"model": "e2b", "prompt": [2, 99999], "stream": True}, 400, "invalid_request"),
    ("chat/completions", {"model": "e4b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 600,
                          "stream": True}, 400, "context_length_exceeded"),
    ("completions", {"model": "e2b", "prompt": "hi", "max_tokens": CTX}, 400, "context_length_exceeded"),
    ("chat/completions", {"model": "e2b", "messages": [{"role": "user", "content": "word " * 600}]}, 400,
     "context_length_exceeded"),
    ("completions", {"prompt": "hi"}, 400, "invalid_value"),
    ("completions", {"model": "e2b", "prompt": "hi", "logprobs": 6}, 400, "invalid_value"),
]


def test_bad_input_battery_then_still_serving(tiny_app):
    with httpx.Client(timeout=60) as h:
        for path, body, status, code in BAD:
            r = h.post(f"{tiny_app}/{path}", json=body)
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]
        r = h.post(f"{tiny_app}/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        assert h.get(f"{tiny_app}/nowhere").status_code == 404
        long_chat = [b for b in BAD if b[3] == "context_length_exceeded" and "max_tokens" not in b[1]
                     and "messages" in b[1]][0]
        assert h.post(f"{tiny_app}/{long_chat[0]}", json=long_chat[1]).json()["error"]["param"] == "messages"
        ok = h.post(f"{tiny_app}/completions", json={"model": "e2b", "prompt": "hi", "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        health = h.get(tiny_app.removesuffix("/v1") + "/health")
        assert health.status_code == 200 and set(health.json()["models"].values()) == {"ready"}


def test_streaming_is_incremental(tiny_app):
    body = {"model": "e4b", "prompt": "Hello", "max_tokens": 300, "ignore_eos": True, "stream": True}
    arrivals = []
    with httpx.Client(timeout=120) as h, h.stream("POST", f"{tiny_app}/completions", json=body) as r:
        start = time.perf_counter()
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.perf_counter() - start)
                if len(arrivals) == 1:
                    in_flight = stats("e4b")["active"]
    assert in_flight == 1  # the first chunk came while the replica was still generating
    # tokens are coalesced into at most one message per stream_interval_ms (40): ~1 s of tokens, many chunks
    assert len(arrivals) >= 10 and arrivals[0] < arrivals[-1] / 3


def test_disconnect_stops_generation(tiny_app):
    before = stats("e2b")
    body = {"model": "e2b", "prompt": "Hello", "max_tokens": 480, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as h, h.stream("POST", f"{tiny_app}/completions", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # leave mid-stream: the connection closes here
    deadline = time.time() + 10
    while (stats("e2b")["cancelled"] == before["cancelled"] or stats("e2b")["running"]) and time.time() < deadline:
        time.sleep(0.1)
    s1 = stats("e2b")
    time.sleep(1.0)
    s2 = stats("e2b")
    assert s1["cancelled"] == before["cancelled"] + 1 and s2["active"] == 0
    assert s2["engine_steps"] == s1["engine_steps"]  # nothing more is spent on it
    assert s2["engine_steps"] - before["engine_steps"] < 480


def test_16_concurrent_requests_across_models(tiny_app, engines):
    from openai import AsyncOpenAI

    names = list(MODELS)
    jobs = [(names[i % 3], f"Request {i}: tell me about {names[i % 3]} number {i}") for i in range(16)]
    want = {(n, p): reference_text(engines[n], engines[n].encode(p), 16) for n, p in jobs}

    async def one(c, name, prompt, stream):
        if stream:
            parts = [ch.choices[0].text async for ch in await c.completions.create(
                model=name, prompt=prompt, max_tokens=16, temperature=0, stream=True)]
            return "".join(parts)
        return (await c.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0)).choices[0].text

    async def run_all():
        async with AsyncOpenAI(base_url=tiny_app, api_key="unused", max_retries=0, timeout=120) as c:
            return await asyncio.gather(*(one(c, n, p, i % 2 == 0) for i, (n, p) in enumerate(jobs)))

    got = asyncio.run(run_all())
    assert [want[j] for j in jobs] == got


def test_backpressure_is_503_and_neuron_cores_are_pinned(serve_url):
    from ray import serve

    fake = {"engine": "doubles.fake_engine:FakeEngine", "engine_options": {"step_s": 0.1}}
    models = [{"name": "slow", "max_ongoing_requests": 1, "max_queued_requests": 1, "path": ".", **fake},
              {"name": "pinned2", "backend": "neuron", "tp": 2, "artifacts": "unused", "path": ".", **fake},
              {"name": "pinned1", "backend": "neuron", "tp": 1, "artifacts": "unused", "path": ".", **fake}]
    url = deploy({"models": models, "graceful_shutdown_wait_loop_s": 0}, "fake", serve_url)
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=60) as h:
                body = {"model": "slow", "prompt": "x", "max_tokens": 20}
                return await asyncio.gather(*(h.post(f"{url}/completions", json=body) for _ in range(6)))

        codes = sorted(r.status_code for r in asyncio.run(burst()))
        assert codes.count(200) >= 1 and codes.count(503) >= 3 and set(codes) <= {200, 503}
        r503 = [r for r in asyncio.run(burst()) if r.status_code == 503][0]
        assert r503.headers.get("retry-after") and r503.json()["error"]["code"] == "overloaded"
        cores = {m: serve.get_deployment_handle(f"Model_{m}", "fake").ready.remote().result()["cores"]
                 for m in ("pinned2", "pinned1")}
        assert len(cores["pinned2"]) == 2 and cores["pinned2"][1] == cores["pinned2"][0] + 1
        assert len(cores["pinned1"]) == 1 and not set(cores["pinned1"]) & set(cores["pinned2"])
    finally:
        serve.delete("fake")


def test_missing_neuron_cores_are_refused_not_left_pending(serve_url):
    """The session cluster has 4 fake NeuronCores: asking for 6 fails at build time with the numbers."""
    from serve_app.app import build_app
    from serve_app.config import AppArgs

    fake = {"engine": "doubles.fake_engine:FakeEngine", "backend": "neuron", "artifacts": "x", "path": "."}
    args = AppArgs(models=[{"name": "a", "tp": 2, "min_replicas": 2, "max_replicas": 2, **fake},
                           {"name": "b", "tp": 2, **fake}])
    with pytest.raises(ValueError, match="need 6 `neuron_cores`.*has 4"):
        build_app(args)


def test_router_process_stays_free_of_torch():
    import subprocess
    import sys

    code = "import sys, serve_app.router, serve_app.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_prometheus_metrics_per_model(tiny_app):
    import os

    def value(name: str) -> float:  # a counter's total for 12b
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f"ray_gemma4_{name}_total{{") and 'model="12b"' in line)

    with httpx.Client(timeout=60) as h:
        body = {"model": "12b", "prompt": "hi", "max_tokens": 5}
        assert h.post(f"{tiny_app}/completions", json=body).status_code == 200
        long = {"model": "12b", "prompt": "The quick brown fox jumps over the lazy dog. " * 4, "max_tokens": 3}
        prompt_tokens = [h.post(f"{tiny_app}/completions", json=long).json()["usage"]["prompt_tokens"]
                         for _ in range(2)]  # the second reuses all but the last prompt token of the first
        assert prompt_tokens[0] > 16
        deadline, text = time.time() + 40, ""
        while time.time() < deadline:
            text = h.get(os.environ["GEMMA4_TEST_METRICS_URL"]).text
            if value("generation_tokens") and value("prefix_cache_hit_tokens") >= prompt_tokens[0] - 1:
                break
            time.sleep(1)
    assert value("prefix_cache_query_tokens") >= 2 * prompt_tokens[0]
    assert value("prefix_cache_hit_tokens") >= prompt_tokens[0] - 1
    assert "ray_gemma4_time_to_first_token_ms_bucket" in text
    assert any(line.startswith("ray_gemma4_request_finished_total") and 'model="12b"' in line
               for line in text.splitlines())

    def count(name: str) -> float:  # a histogram's observations for 12b (the engine's paced messages carry them)
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f"ray_gemma4_{name}_count") and 'model="12b"' in line)

    assert count("batch_occupancy") >= 4 and count("inter_token_latency_ms") >= 4  # 5 tokens: 5 steps, 4 gaps
