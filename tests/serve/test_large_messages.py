"""Requests and answers larger than Serve's default 4 MiB gRPC message cross the router's gRPC handles (real
Ray cluster, real HTTP, the fake engine): a body the app allows reaches the engine and gets the engine's
own 400, streamed or not, and an answer of several MiB (logprobs) arrives whole."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import deploy

pytestmark = pytest.mark.slow
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def app(serve_url):
    from ray import serve

    model = {"name": "big", "path": ".", "engine": "doubles.fake_engine:FakeEngine", "engine_options": {"step_s": 0.0},
             "max_context": 16384}
    url = deploy({"models": [model], "max_request_bytes": 8 * MIB, "graceful_shutdown_wait_loop_s": 0}, "large",
                 serve_url)
    yield url
    serve.delete("large")


@pytest.mark.parametrize("stream", [False, True])
def test_a_body_above_4_mib_reaches_the_engine(app, stream):
    body = json.dumps({"model": "big", "prompt": "x" * (5 * MIB), "max_tokens": 4, "stream": stream}).encode()
    assert len(body) > 5 * MIB
    r = httpx.post(f"{app}/completions", content=body, headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt", err


def test_an_answer_above_4_mib_arrives_whole(app):
    body = {"model": "big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12000, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 20}
    with httpx.Client(timeout=300) as h:
        r = h.post(f"{app}/chat/completions", json=body)
        assert r.status_code == 200, r.text[:500]
        assert len(r.content) > 4 * MIB
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["logprobs"]["content"]) == 12000
        assert all(len(e["top_logprobs"]) == 20 for e in choice["logprobs"]["content"])
        assert "".join(e["token"] for e in choice["logprobs"]["content"]) == choice["message"]["content"]
