"""What the HTTP serving path delivers of what its engine can do: the same greedy requests through Ray Serve
+ HTTP on configs/local.yaml and in this process (`build_engine` with the replica's own settings: its
max_batch, one thread), 8 concurrent and one at a time, same run, rounds interleaved.

    python bench/serve_efficiency.py [--model gemma-4-e2b-tiny] [--tokens 48] [--requests 8] [--rounds 3]

The cluster gets what `python -m serve_app.run` gives one (serve_app/ops/ray_env.py: HAProxy in front);
`RAY_SERVE_ENABLE_HA_PROXY=0 python bench/serve_efficiency.py` measures Ray's Python proxy instead (what
plain `serve run` gives). Prints tokens/s of each (median of the rounds) and the ratios HTTP / in-process
(goals: concurrent >= 0.8, one at a time >= 0.9), for streamed and non-streamed requests; "per round" is
the median of each round's HTTP / in-process, taken seconds apart (a shared box's speed drifts more than
that over a run). Every HTTP answer must equal the in-process one (greedy). The in-process engine runs on
the CPUs the replica's engine process gets (`engine_cpus`), the client on any; the client is aiohttp
(what vLLM's serving benchmark uses), its connections kept alive (`--client httpx` for httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from http_client import CLIENTS, client, completion_text  # noqa: E402  (bench/, beside this script)
from local_app import local_app, on_cpus  # noqa: E402

GOALS = {"concurrent": 0.8, "one at a time": 0.9}


def prompts(n: int) -> list[str]:
    return [f"Request {i}: tell me a story about the sea number {i}" for i in range(n)]


def in_process(engine, texts, tokens, together: bool) -> tuple[float, list[list[int]]]:
    from neuron_workers.engine.params import SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    t = time.perf_counter()
    seqs = [engine.new_sequence(engine.encode(x), params) for x in texts] if together else None
    if together:
        out = {s.seq_id: [] for s in seqs}
        for ev in engine.run_all(seqs):
            out[ev.seq_id].append(ev.token_id)
        ids = list(out.values())
    else:
        ids = [[ev.token_id for ev in engine.generate(engine.encode(x), params)] for x in texts]
    return time.perf_counter() - t, ids


def body(model, text, tokens, stream) -> dict:
    return {"model": model, "prompt": text, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream": stream}


async def over_http(h, url, model, texts, tokens, stream, together: bool) -> tuple[float, list[str]]:
    """`h`: the client, its pool of connections kept alive (a real client's, opened at warm-up)."""
    t = time.perf_counter()
    if together:
        out = await asyncio.gather(*(completion_text(h, url, body(model, x, tokens, stream)) for x in texts))
    else:
        out = [await completion_text(h, url, body(model, x, tokens, stream)) for x in texts]
    return time.perf_counter() - t, list(out)


async def measure(url, args, engine, cpus, texts, rates) -> None:
    """The rounds: in-process and over HTTP (streamed, then not), 8 together and then one at a time."""
    n, tok = args.requests * args.tokens, engine.tokenizer
    async with client(args.client, args.requests) as h:
        await over_http(h, url, args.model, texts, 4, True, True)  # warm-up: opens the pool
        for _ in range(args.rounds):
            for together in (True, False):
                how = "concurrent" if together else "one at a time"
                with on_cpus(cpus):  # the CPUs the replica's engine process runs on
                    secs, ids = in_process(engine, texts, args.tokens, together)
                rates.setdefault((how, "in-process"), []).append(n / secs)
                want = [tok.decode(i, skip_special_tokens=True) for i in ids]
                for stream in (True, False):
                    secs, got = await over_http(h, url, args.model, texts, args.tokens, stream, together)
                    assert got == want, f"an HTTP answer differs from the in-process one ({how}, stream={stream})"
                    rates.setdefault((how, "streamed" if stream else "non-streamed"), []).append(n / secs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-4-e2b-tiny")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--client", choices=CLIENTS, default="aiohttp", help="the HTTP client (default aiohttp)")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from neuron_workers.factory import build_engine

    texts = prompts(args.requests)
    rates: dict[tuple[str, str], list[float]] = {}
    with local_app() as (url, built):  # the cluster's environment is set now
        ingress = "HAProxy" if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" else "Ray's proxy"
        spec = next(m for m in built.models if m.name == args.model)
        engine = build_engine(spec.engine_config())  # the replica's settings (threads, max_batch, backend)
        in_process(engine, texts[:2], 4, True)  # warm-up
        asyncio.run(measure(url, args, engine, spec.engine_cpus, texts, rates))
    print(f"ingress: {ingress}; client: {args.client}, connections kept alive")
    print(f"{args.model} via configs/local.yaml (max_batch {engine.max_batch}, {spec.backend}, engine_cpus "
          f"{spec.engine_cpus}), {args.requests} "
          f"greedy requests x {args.tokens} tokens, median of {args.rounds} rounds; HTTP answers identical: yes")
    for how in ("concurrent", "one at a time"):
        base = statistics.median(rates[(how, "in-process")])
        line = f"{how:14s} in-process {base:7.1f} tok/s"
        for kind in ("streamed", "non-streamed"):
            r = statistics.median(rates[(how, kind)])
            paired = statistics.median(h / b for h, b in zip(rates[(how, kind)], rates[(how, "in-process")]))
            line += f" | HTTP {kind} {r:7.1f} tok/s ratio {r / base:.2f} (per round {paired:.2f})"
        print(line + f"  (goal >= {GOALS[how]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
