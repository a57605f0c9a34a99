"""Shutdown under traffic: `python -m serve_app.run` (a Ray head of its own, started with `ray start`,
the fake engine) gets SIGTERM or SIGINT by PID with streams and non-streams in flight. Requests that
can finish within graceful_shutdown_timeout_s finish whole; the longer ones end with the stream error
event / a 503 `shutting_down`; a request sent during the drain gets 503 with Retry-After; the server
exits. Before that, through the real proxy: a huge request head is a 431, a body that never completes a
408, an idle keep-alive connection is closed, and a client that disconnects is one log line, not a
traceback."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time

import httpx
import pytest

from localcluster import free_port, ray_head, serve_run, wait_ready, write_config

pytestmark = pytest.mark.slow
STEP_S = 0.05
DRAIN_S = 6.0


def fake(name, **kw):
    return {"name": name, "path": ".", "engine": "doubles.fake_engine:FakeEngine", "max_context": 4096,
            "engine_options": {"step_s": STEP_S}, "max_batch": 8, **kw}


async def request(h, url, n, stream, i, started: asyncio.Event | None = None):
    """One completion; a stream sets `started` when its first event arrives (the request is generating)."""
    body = {"model": "m", "prompt": f"job {i}", "max_tokens": n, "ignore_eos": True, "stream": stream}
    if not stream:
        r = await h.post(f"{url}/v1/completions", json=body)
        return r.status_code, r.json(), dict(r.headers)
    async with h.stream("POST", f"{url}/v1/completions", json=body) as r:
        events = []
        async for x in r.aiter_lines():
            if x.startswith("data: "):
                events.append(json.loads(x[6:]) if x != "data: [DONE]" else "[DONE]")
                if started is not None:
                    started.set()
        return r.status_code, events, dict(r.headers)


def text_of(events):
    return "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices"))


def raw(port: int, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(data)
    return s


def read_until(s: socket.socket, marker: bytes) -> bytes:
    """What the server sent until `marker` arrived or it closed the connection (recv times out at 20 s)."""
    out = b""
    while marker not in out and (chunk := s.recv(65536)):
        out += chunk
    return out


def read_until_closed(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def slow_clients_are_turned_away(port: int) -> None:
    r = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"x-junk": "a" * 20000}, timeout=20)
    assert r.status_code == 431 and r.json()["error"]["code"] == "request_header_too_large"
    half_open = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{")  # 99 bytes of body never come
    head = read_until(half_open, b"request_timeout")  # the head and the body may come in two segments
    assert head.startswith(b"HTTP/1.1 408") and b"request_timeout" in head, head
    half_open.close()
    idle = raw(port, b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive, then nothing
    answer = read_until_closed(idle)  # the server closes it after keep_alive_timeout_s (2 s here)
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1
    idle.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_in_flight_requests_then_exits(tmp_path, sig):
    head, gcs = ray_head(tmp_path, {"neuron_cores": 0})
    port = free_port()
    cfg = write_config(tmp_path, port, {"accelerator_resource": "", "graceful_shutdown_timeout_s": DRAIN_S,
                                        "graceful_shutdown_wait_loop_s": 0.2, "models": [fake("m")],
                                        "max_header_bytes": 8192, "body_timeout_s": 1.0}, keep_alive_timeout_s=2)
    server = None
    url = f"http://127.0.0.1:{port}"
    try:
        server = serve_run(tmp_path, cfg, gcs)
        wait_ready(url, 150, server, others=[head])
        slow_clients_are_turned_away(port)
        with httpx.Client(timeout=30) as h, h.stream("POST", f"{url}/v1/completions", json={
                "model": "m", "prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 3:
                    break  # the client leaves mid-stream

        async def scenario():
            async with httpx.AsyncClient(timeout=120) as h:
                go = [asyncio.Event() for _ in range(6)]
                short = [asyncio.create_task(request(h, url, 40, i % 2 == 0, i, go[i])) for i in range(4)]  # ~2 s
                long = [asyncio.create_task(request(h, url, 1000, i % 2 == 0, 10 + i, go[4 + i]))
                        for i in range(2)]  # ~50 s
                # all six are generating: the streams have their first events (the plain ones were sent first);
                # waited for, not slept on, so a loaded machine does not send the signal before they arrive
                await asyncio.wait_for(asyncio.gather(*(go[i].wait() for i in (0, 2, 4))), 60)
                await asyncio.sleep(0.3)
                server.send(sig)
                t_signal = time.monotonic()
                await asyncio.sleep(1.0)
                late = await request(h, url, 5, False, 99)  # arrives during the drain
                health = await h.get(f"{url}/health")
                return await asyncio.gather(*short), await asyncio.gather(*long), late, health, t_signal

        short, long, late, health, t_signal = asyncio.run(scenario())
        for status, body, _ in short:  # finished whole, in shape
            assert status == 200, body
            if isinstance(body, list):
                assert body[-1] == "[DONE]" and len(text_of(body)) == 40, body[-3:]
            else:
                assert body["usage"]["completion_tokens"] == 40
        for status, body, headers in long:  # ended by the drain: an error event / a 503, never a cut
            if isinstance(body, list):
                assert status == 200 and body[-1] == "[DONE]" and "error" in body[-2], body[-3:]
                assert body[-2]["error"]["code"] == "shutting_down", body[-2]
                assert 0 < len(text_of(body)) < 1000
            else:
                assert status == 503 and body["error"]["code"] == "shutting_down" and headers.get("retry-after")
        status, body, headers = late
        assert status == 503 and body["error"]["code"] == "shutting_down" and headers.get("retry-after")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert server.wait(60) is not None, server.text()[-3000:]
        took = time.monotonic() - t_signal
        assert DRAIN_S <= took < DRAIN_S + 40, took
        log = server.text()
        assert "draining" in log and "disconnected" in log and "Traceback" not in log
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if server is not None:
            server.stop()
        head.stop()
