"""Test helper (not a double): Ray nodes started with `ray start --block` and the server started with
`python -m serve_app.run`, each a subprocess in its own process group on 127.0.0.1, stopped by PID.
Every wait is bounded."""

from __future__ import annotations

import json
import os
import signal as sig_mod
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from conftest import free_port  # tests/ is on the path; ports outside the ephemeral range

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def env(**extra) -> dict:
    e = dict(os.environ)
    e.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1",
             PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]), **extra)
    # how long the GCS looks for a starting node before `ray start` gives up ("timed out during startup"): on a
    # host running two test suites at once its first look took 68 s and found nothing
    e.setdefault("RAY_raylet_start_wait_time_s", "120")
    # this node's HAProxy side ports, apart from any other Serve on this machine (the tests' own, other nodes)
    e["RAY_SERVE_HAPROXY_STATS_PORT"], e["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(free_port()), str(free_port())
    e.pop("RAY_ADDRESS", None)
    return e


class Proc:
    """A subprocess in its own process group, its output in a file."""

    def __init__(self, args: list[str], log: Path, cleanup: Path | None = None, **kw):
        self.log, self.cleanup = log, cleanup
        self.out = open(log, "wb")
        self.p = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True,
                                  cwd=ROOT, **kw)

    def send(self, sig) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, sig)

    def kill_group(self, sig=sig_mod.SIGKILL) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int | None:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the group, then SIGKILL to whatever is left of it."""
        self.kill_group(sig_mod.SIGTERM)
        self.wait(timeout)
        self.kill_group(sig_mod.SIGKILL)
        self.wait(5)
        self.out.close()
        if self.cleanup is not None:  # Ray's session directory (sockets, logs) of this process
            import shutil

            shutil.rmtree(self.cleanup, ignore_errors=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def short_tmp() -> Path:
    """Ray's unix sockets need a short temp dir (107 bytes); pytest's tmp_path is too long."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="g4r-", dir="/tmp"))


def ray_node(tmp: Path, name: str, resources: dict, head_port: int | None = None, gcs_port: int | None = None,
             num_cpus: int = 2, ray_tmp: Path | None = None, extra_env: dict | None = None) -> Proc:
    """`ray start --block` for a head (gcs_port) or a node joining 127.0.0.1:head_port; `extra_env` reaches
    every process of the node (its Serve proxy and HAProxy too)."""
    ray_tmp = ray_tmp or short_tmp()
    args = [str(Path(sys.executable).with_name("ray")), "start", "--block", "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources)}", "--object-store-memory=80000000",
            "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--temp-dir={ray_tmp}"]
    if gcs_port is not None:
        args += ["--head", f"--port={gcs_port}", "--include-dashboard=false",
                 f"--ray-client-server-port={free_port()}"]
    else:
        args += [f"--address=127.0.0.1:{head_port}"]
    return Proc(args, tmp / f"{name}.log", cleanup=ray_tmp, env=env(**(extra_env or {})))


STARTED = b"Ray runtime started."  # what `ray start` prints once its node is up (then --block blocks)


def ray_head(tmp: Path, resources: dict, extra_env: dict | None = None, tries: int = 2) -> tuple[Proc, int]:
    """A head node that has started, and its GCS port. Ray's own start can fail on a loaded host (its node
    waits a fixed 30 s for the GCS to list it: "timed out during startup"), or a port picked here can be taken
    before Ray binds it: the node then exits, and it is started again with fresh ports."""
    for attempt in range(1, tries + 1):
        gcs = free_port()
        head = ray_node(tmp, "head" if attempt == 1 else f"head-{attempt}", resources, gcs_port=gcs,
                        extra_env=extra_env)
        if up(head):
            return head, gcs
    raise AssertionError(f"no Ray head after {tries} tries:\n{head.text()[-3000:]}")


def ray_worker(tmp: Path, name: str, resources: dict, head_port: int, tries: int = 2) -> Proc:
    """A node that has joined the head at `head_port` (started again, as in `ray_head`, when its start fails)."""
    for attempt in range(1, tries + 1):
        node = ray_node(tmp, name if attempt == 1 else f"{name}-{attempt}", resources, head_port=head_port)
        if up(node):
            return node
    raise AssertionError(f"{name} did not join after {tries} tries:\n{node.text()[-3000:]}")


def up(node: Proc, timeout: float = 120) -> bool:
    """True once `node` says it is up; False, the node stopped (its log kept), when it exits first or takes
    longer than `timeout`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if STARTED in node.log.read_bytes():
            return True
        if node.p.poll() is not None:
            break
        time.sleep(0.2)
    node.stop()
    print(f"{node.log.name} did not start:\n{node.text()[-600:]}")  # shown if the test fails
    return False


def write_config(tmp: Path, port: int, args: dict, deployments: list | None = None,
                 proxy_location: str = "HeadOnly", **http) -> Path:
    app = {"name": "gemma4", "route_prefix": "/", "import_path": "serve_app.app:build_app", "args": args}
    if deployments:
        app["deployments"] = deployments
    cfg = {"proxy_location": proxy_location, "http_options": {"host": "127.0.0.1", "port": port, **http},
           "applications": [app]}
    path = tmp / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def serve_run(tmp: Path, config: Path, gcs_port: int) -> Proc:
    ray_tmp = short_tmp()
    return Proc([sys.executable, "-m", "serve_app.run", str(config), f"--address=127.0.0.1:{gcs_port}"],
                tmp / "serve_run.log", cleanup=ray_tmp, env=env(RAY_TMPDIR=str(ray_tmp)))


def wait_ready(url: str, timeout: float, proc: Proc | None = None, want=None, others=()) -> dict:
    """Poll GET /health until it is 200 (and `want(body)` holds); returns the body. Fails at once when
    `proc` or one of `others` (Ray nodes) has exited."""
    deadline, last = time.time() + timeout, None
    with httpx.Client(timeout=5) as h:
        while time.time() < deadline:
            for p in ([proc] if proc else []) + list(others):
                if p.p.poll() is not None:
                    raise AssertionError(f"{p.log.name} exited ({p.p.returncode}):\n{p.text()[-3000:]}")
            try:
                r = h.get(f"{url}/health")
                last = r.text
                if r.status_code == 200 and (want is None or want(r.json())):
                    return r.json()
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(0.5)
    raise AssertionError(f"not ready after {timeout} s: {last}\n{proc.text()[-3000:] if proc else ''}")
