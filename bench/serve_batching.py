"""Continuous batching through Ray Serve and HTTP, on configs/local.yaml: 8 concurrent requests to one
model against the same 8 requests sent one at a time, same run.

    python bench/serve_batching.py [--model gemma-4-e2b-tiny] [--tokens 64] [--requests 8] [--stream]

Every answer must equal its one-at-a-time answer (greedy). Prints the aggregate generated tokens/s of
both and their ratio (goal: concurrent >= 4x sequential).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from http_client import completion_text  # noqa: E402  (bench/, beside this script)
from local_app import local_app  # noqa: E402


def body(args, i):
    return {"model": args.model, "prompt": f"Request {i}: tell me a story about the sea number {i}",
            "max_tokens": args.tokens, "ignore_eos": True, "temperature": 0, "stream": args.stream}


async def measure(url, bodies):
    import httpx

    async with httpx.AsyncClient(timeout=300) as h:
        await completion_text(h, url, bodies[0])  # warm-up
        t = time.perf_counter()
        solo = [await completion_text(h, url, b) for b in bodies]
        t_solo = time.perf_counter() - t
        t = time.perf_counter()
        together = await asyncio.gather(*(completion_text(h, url, b) for b in bodies))
        t_together = time.perf_counter() - t
    return solo, t_solo, list(together), t_together


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-4-e2b-tiny")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--stream", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with local_app() as (url, _):
        bodies = [body(args, i) for i in range(args.requests)]
        solo, t_solo, together, t_together = asyncio.run(measure(url, bodies))
    assert together == solo, "a concurrent answer differs from its one-at-a-time answer"
    n = args.requests * args.tokens
    print(f"{args.model} via configs/local.yaml (cpu, max_batch from the config), {args.requests} requests x "
          f"{args.tokens} tokens, {'streamed' if args.stream else 'non-streaming'}; answers identical: yes")
    print(f"one at a time: {t_solo:6.2f} s  {n / t_solo:7.1f} tok/s")
    print(f"concurrent:    {t_together:6.2f} s  {n / t_together:7.1f} tok/s")
    print(f"ratio concurrent / one at a time: {t_solo / t_together:.2f}x  (goal >= 4x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
