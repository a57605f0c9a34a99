"""What the serving benches share: configs/local.yaml's app served on a free port of 127.0.0.1 from a
temporary directory (its tiny checkpoints written there), on a local Ray cluster started as
`python -m serve_app.run` starts one (serve_app/ops/ray_env.py: HAProxy in front unless the environment says
otherwise); and `on_cpus`, which runs a bench's in-process engine on the CPUs the replica's engine
process gets (`engine_cpus`), so both sides of a ratio run with the replica's settings."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def on_cpus(wanted: list[int] | None):
    """This thread on `wanted` (a ModelSpec's engine_cpus) inside the block; nothing when unset."""
    if not wanted or not hasattr(os, "sched_setaffinity"):
        yield
        return
    from serve_app.replica.host import resolve_cpus

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, resolve_cpus(wanted, sorted(before)))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def local_app():
    """Yields (base URL, the app's AppArgs); shuts Serve and Ray down after."""
    import ray
    import yaml
    from ray import serve

    from serve_app.app import build_app
    from serve_app.config import AppArgs
    from serve_app.ops.ray_env import apply_cluster_env

    app_args = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())["applications"][0]["args"]
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        app_args.update(tiny_dir=tmp, base_dir=tmp)
        for m in app_args["models"]:
            m["path"] = str(Path(tmp) / Path(m["path"]).name)
        built = AppArgs(**app_args)
        apply_cluster_env()  # before Ray starts: a local cluster's processes inherit it
        ray.init(include_dashboard=False, log_to_driver=False)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(build_app(built), name="bench", route_prefix="/")
            yield f"http://127.0.0.1:{port}", built
        finally:
            serve.shutdown()
            ray.shutdown()
