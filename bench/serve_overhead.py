"""What Ray Serve + HTTP adds: time to first token and decode tokens/s through the OpenAI endpoint
(streaming) vs calling the engine directly in this process, same tiny model and settings as the replica
(one thread, max_batch 8), same run, interleaved.

    python bench/serve_overhead.py [--tokens 128] [--repeats 5] [--model gemma4-e4b-tiny]

Prints the medians, the added milliseconds to first token and the ratio of decode rates (HTTP / direct).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def direct(engine, ids, n):
    from neuron_workers.engine.params import SamplingParams

    t0 = time.perf_counter()
    it = engine.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))
    next(it)
    t1 = time.perf_counter()
    count = 1 + sum(1 for _ in it)
    return t1 - t0, (count - 1) / (time.perf_counter() - t1)


def over_http(client, url, ids, n):
    body = {"model": "m", "prompt": ids, "max_tokens": n, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            now = time.perf_counter()
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            elif first is None:
                first = now
            last = now
    return first - t0, (tokens - 1) / (last - first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="gemma4-e4b-tiny")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import httpx
    import ray
    from ray import serve

    from neuron_workers.config import EngineConfig
    from neuron_workers.factory import build_engine
    from neuron_workers.testing.tiny import ensure_tiny
    from serve_app.app import build_app
    from serve_app.config import AppArgs

    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_tiny(tmp)[args.model]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        from serve_app.ops.ray_env import apply_cluster_env

        apply_cluster_env()  # what `python -m serve_app.run` gives the cluster it starts (HAProxy ingress)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        spec = {"name": "m", "path": str(path), "backend": "cpu", "max_context": 512}
        serve.run(build_app(AppArgs(models=[spec], accelerator_resource="")), name="bench", route_prefix="/")
        # as the replica runs it: one thread, graphs for max_batch rows (8 by default; one row is live here)
        engine = build_engine(EngineConfig(model=str(path), max_context=512, threads=1, max_batch=8))
        ids = list(range(2, 34))
        rows = {"direct": [], "http": []}
        with httpx.Client(timeout=120) as client:
            direct(engine, ids, 8), over_http(client, f"http://127.0.0.1:{port}", ids, 8)  # warm-up
            for _ in range(args.repeats):
                rows["direct"].append(direct(engine, ids, args.tokens))
                rows["http"].append(over_http(client, f"http://127.0.0.1:{port}", ids, args.tokens))
        serve.shutdown()
        ray.shutdown()
    med = {k: (statistics.median(t for t, _ in v) * 1e3, statistics.median(r for _, r in v)) for k, v in rows.items()}
    print(f"model {args.model} (cpu, eager), prompt {len(ids)} tokens, {args.tokens} new tokens, "
          f"median of {args.repeats}")
    for k, (ttft, rate) in med.items():
        print(f"{k:7s} time to first token {ttft:7.1f} ms   decode {rate:7.1f} tok/s")
    print(f"added by Serve+HTTP: {med['http'][0] - med['direct'][0]:+.1f} ms to first token; "
          f"decode rate ratio http/direct {med['http'][1] / med['direct'][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
