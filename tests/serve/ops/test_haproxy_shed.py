"""HAProxy's config rewrite (serve_app/ops/haproxy_shed.py) is valid for the HAProxy binary ray[serve] ships
and puts each setting in its section (the whole-cluster test is tests/serve/test_slow_heads.py)."""

from __future__ import annotations

import subprocess

from serve_app.ops.haproxy_shed import real_binary, rewrite

CONFIG = """global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 3600s
frontend http_frontend
    bind 127.0.0.1:18000
    default_backend app
backend app
    server s1 127.0.0.1:18001
"""


def test_the_rewrite_adds_the_head_timeout_and_the_source_cap_and_haproxy_accepts_it(tmp_path):
    out = rewrite(CONFIG, http_request_s=7, per_source=12)
    lines = [x.strip() for x in out.splitlines()]
    assert lines.index("timeout http-request 7s") == lines.index("defaults") + 1
    bind = lines.index("bind 127.0.0.1:18000")
    assert lines[bind + 1].startswith("stick-table type ip")
    assert lines[bind + 2] == "tcp-request connection track-sc0 src"
    assert lines[bind + 3] == "tcp-request connection reject if { sc0_conn_cur gt 12 }"
    assert "stick-table" not in rewrite(CONFIG, per_source=0) and rewrite(out).count("timeout http-request") == 1
    cfg = tmp_path / "h.cfg"
    cfg.write_text(out)
    check = subprocess.run([real_binary(), "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
