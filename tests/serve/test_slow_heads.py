"""More half-open request heads than HAProxy's connection limit no longer keep a request out (a real cluster
started with `ray start` and `python -m serve_app.run`, HAProxy through serve_app/ops/haproxy-shed)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from serve_app.ops.ray_env import CLUSTER, shed_env

from localcluster import free_port, ray_head, serve_run, wait_ready, write_config


def half_open(port: int) -> socket.socket | None:
    """A connection whose request head never ends, or None when HAProxy refused the connection."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head's last line never comes
        return s
    except ConnectionError:
        return None


def closed_within(s: socket.socket, timeout: float) -> bytes | None:
    """What the server sent before closing `s`, or None if it was still open after `timeout`."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(4096):
            out += chunk
    except (TimeoutError, socket.timeout):
        return None
    except ConnectionResetError:
        pass
    return out


@pytest.mark.slow
def test_more_half_open_heads_than_maxconn_do_not_keep_a_request_out(tmp_path):
    """HAProxy at maxconn 40 and 60 heads that never finish: the per-source cap (30) refuses half of them at
    once, `timeout http-request` (2 s) answers 408 to the rest, and a real request gets through in seconds
    (without the wrapper it waited for Serve's one-hour client timeout)."""
    port = free_port()
    extra = {**CLUSTER, **shed_env(), "RAY_SERVE_HAPROXY_MAXCONN": "40", "GEMMA4_HAPROXY_HTTP_REQUEST_TIMEOUT_S": "2",
             "GEMMA4_HAPROXY_MAX_CONN_PER_SOURCE": "30"}
    head, gcs = ray_head(tmp_path, {"neuron_cores": 0}, extra_env=extra)
    model = {"name": "m", "path": ".", "engine": "doubles.fake_engine:FakeEngine", "max_context": 256}
    cfg = write_config(tmp_path, port, {"accelerator_resource": "", "models": [model]})
    server = None
    try:
        server = serve_run(tmp_path, cfg, gcs)
        wait_ready(f"http://127.0.0.1:{port}", 150, server, others=[head])
        time.sleep(1.0)  # the wait's own keep-alive connection is gone
        tried = [half_open(port) for _ in range(60)]
        heads = [s for s in tried if s is not None]
        t0 = time.monotonic()
        got, deadline = None, t0 + 20
        while got is None and time.monotonic() < deadline:
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/health", timeout=3)
            except httpx.HTTPError:
                time.sleep(0.2)
        took = time.monotonic() - t0
        until = time.monotonic() + 10  # one deadline for all of them: a failing run ends in seconds
        ends = [closed_within(s, max(until - time.monotonic(), 0.01)) for s in heads]
        for s in heads:
            s.close()
        assert got is not None and got.status_code == 200, f"no answer within {took:.1f} s"
        assert took < 10, took
        assert all(e is not None for e in ends), "a half-open head was still held after 10 s"
        refused = len(tried) - len(heads) + sum(e == b"" for e in ends)  # at connect, or closed at once
        timed_out = sum(e.startswith(b"HTTP/1.1 408") for e in ends)
        assert timed_out >= 20 and refused >= 20, (timed_out, refused)
    finally:
        if server is not None:
            server.stop()
        head.stop()
