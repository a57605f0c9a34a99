"""The test harness's Ray node start (`localcluster.ray_head`): a node that exits during its start (as Ray's own
start does when it times out on a loaded host) is started again with a fresh port; one that never starts fails
with its log."""

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
