"""The test harness (`localcluster`): ports outside the ephemeral range; a Ray node that exits during its start
(as Ray's own start does when it times out on a loaded host) is started again with a fresh port; one that never
starts fails with its log."""

from __future__ import annotations

import sys

import pytest

import localcluster
from localcluster import Proc


def fake_nodes(monkeypatch, tmp_path, scripts: list[str]) -> list[dict]:
    """`ray_node` replaced by Python processes running `scripts` in turn; the calls' keyword arguments."""
    calls = []

    def ray_node(tmp, name, resources, **kw):
        calls.append({"name": name, **kw})
        return Proc([sys.executable, "-c", scripts[len(calls) - 1]], tmp / f"{name}.log")

    monkeypatch.setattr(localcluster, "ray_node", ray_node)
    return calls


def test_a_head_that_exits_during_its_start_is_started_again(monkeypatch, tmp_path):
    calls = fake_nodes(monkeypatch, tmp_path, [
        "print('The current node timed out during startup.'); raise SystemExit(1)",
        "import time; print('Ray runtime started.', flush=True); time.sleep(60)"])
    head, gcs = localcluster.ray_head(tmp_path, {})
    try:
        assert [c["name"] for c in calls] == ["head", "head-2"] and gcs == calls[1]["gcs_port"]
        assert head.p.poll() is None and "timed out" in (tmp_path / "head.log").read_text()
    finally:
        head.stop()


def test_a_node_that_never_starts_fails_with_its_log(monkeypatch, tmp_path):
    fake_nodes(monkeypatch, tmp_path, ["print('no GCS'); raise SystemExit(1)"] * 2)
    with pytest.raises(AssertionError, match="did not join after 2 tries:\nno GCS"):
        localcluster.ray_worker(tmp_path, "worker", {}, 1234)


def test_ports_come_from_outside_the_ephemeral_range():
    """Ray's processes take ephemeral ports for their own connections at any time: a port the tests hand to a
    server (HAProxy's stats port, the GCS) comes from a range only an explicit bind takes."""
    low, high = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    ports = {localcluster.free_port() for _ in range(50)}
    assert all(not low <= p <= high and not 10002 <= p <= 19999 for p in ports) and len(ports) > 40
