"""What Ray Serve itself costs a request, beside what our app costs one: a floor app with no engine (a
FastAPI router replica calling a model replica through a handle, as ours does: streamed through an async
generator of two items, non-streamed through one call) and configs/local.yaml's app, one request at a
time, same cluster and settings (serve_app/ops/ray_env.py: HAProxy in front), rounds interleaved.

    python bench/serve_floor.py [--model gemma-4-e2b-tiny] [--tokens 48] [--requests 8] [--rounds 5]

Prints ms per request (medians over rounds; each round takes in-process, ours and the floor back to back):
the same requests in this process (the engine on the replica's engine CPUs), ours over HTTP, what HTTP
adds to ours, the floor's, and how much of what HTTP adds is more than the floor. What the floor costs
no change to our code can save: it bounds the one-at-a-time ratio of bench/serve_efficiency.py at
in-process / (in-process + floor).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from http_client import client, completion_text  # noqa: E402  (bench/, beside this script)
from local_app import local_app, on_cpus  # noqa: E402
from serve_efficiency import body, in_process, prompts  # noqa: E402


def floor_app():
    """The floor: our topology and Serve settings, no engine. Its answers have our response's shape."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from ray import serve

    from serve_app.ops import ray_env

    api = FastAPI()
    opts = {"num_cpus": 0, "runtime_env": {"env_vars": dict(ray_env.REPLICA)}}

    @serve.deployment(ray_actor_options=opts)
    class FloorModel:
        async def generate(self, text: str):
            yield text[: len(text) // 2]
            yield text[len(text) // 2:]

        async def complete(self, text: str) -> str:
            return text

    @serve.deployment(ray_actor_options=opts)
    @serve.ingress(api)
    class FloorRouter:
        def __init__(self, model):
            self.model = model.options(_by_reference=False)  # as serve_app/router.py: Serve's gRPC transport

        @api.post("/v1/completions")
        async def completions(self, req: dict):
            text = req["prompt"]
            if not req.get("stream"):
                return {"choices": [{"index": 0, "text": await self.model.complete.remote(text)}]}
            gen = self.model.options(stream=True).generate.remote(text)
            first = await gen.__anext__()
            return StreamingResponse(self._sse(first, gen), media_type="text/event-stream")

        @staticmethod
        async def _sse(first, gen):
            yield f"data: {json.dumps({'choices': [{'index': 0, 'text': first}]})}\n\n"
            async for part in gen:
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': part}]})}\n\n"
            yield "data: [DONE]\n\n"

    return FloorRouter.bind(FloorModel.bind())


async def one_at_a_time(h, url, texts, make_body) -> tuple[float, list[str]]:
    """Seconds per request (mean over texts) and the answers."""
    t, out = time.perf_counter(), []
    for x in texts:
        out.append(await completion_text(h, url, make_body(x)))
    return (time.perf_counter() - t) / len(texts), out


async def measure(url, floor_url, args, engine, cpus, texts, ms) -> None:
    """Per round and kind (streamed, non-streamed): in-process, ours over HTTP, the floor, back to back, so
    that each difference is taken within a few seconds (this box drifts more than that between rounds)."""
    tok = engine.tokenizer
    async with client("aiohttp", 2) as h:
        for u in (url, floor_url):  # warm-up: opens the connections
            await completion_text(h, u, body(args.model, texts[0], 4, True))
        for _ in range(args.rounds):
            for stream in (True, False):
                kind = "streamed" if stream else "non-streamed"
                with on_cpus(cpus):
                    secs, ids = in_process(engine, texts, args.tokens, together=False)
                base = secs / len(texts) * 1e3
                want = [tok.decode(i, skip_special_tokens=True) for i in ids]
                secs, got = await one_at_a_time(h, url, texts, lambda x, s=stream: body(args.model, x, args.tokens, s))
                assert got == want, f"an HTTP answer differs from the in-process one (stream={stream})"
                ours = secs * 1e3
                secs, got = await one_at_a_time(h, floor_url, texts, lambda x, s=stream: {"prompt": x, "stream": s})
                assert got == texts, f"the floor app answered wrongly (stream={stream})"
                for key, v in (("in-process", base), ("ours", ours), ("floor", secs * 1e3), ("added", ours - base),
                               ("ratio", base / ours), ("beyond", ours - base - secs * 1e3)):
                    ms.setdefault((kind, key), []).append(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-4-e2b-tiny")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray import serve

    from neuron_workers.factory import build_engine

    texts = prompts(args.requests)
    ms: dict[tuple[str, str], list[float]] = {}
    with local_app() as (url, built):
        serve.run(floor_app(), name="floor", route_prefix="/floor")
        spec = next(m for m in built.models if m.name == args.model)
        engine = build_engine(spec.engine_config())
        in_process(engine, texts[:2], 4, True)  # warm-up
        asyncio.run(measure(url, f"{url}/floor", args, engine, spec.engine_cpus, texts, ms))
    med = {k: statistics.median(v) for k, v in ms.items()}
    ingress = "HAProxy" if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" else "Ray's proxy"
    print(f"ingress: {ingress}; {args.model}, {args.requests} greedy requests x {args.tokens} tokens one at a "
          f"time, median of {args.rounds} rounds; ms per request")
    for kind in ("streamed", "non-streamed"):
        m = {key: med[(kind, key)] for key in ("in-process", "ours", "floor", "added", "ratio", "beyond")}
        print(f"{kind:12s} in-process {m['in-process']:6.1f} | ours over HTTP {m['ours']:6.1f} (HTTP adds "
              f"{m['added']:4.1f}, ratio {m['ratio']:.2f}) | Serve floor {m['floor']:4.1f} | ours beyond the "
              f"floor {m['beyond']:+5.1f}; the floor alone bounds the ratio at "
              f"{m['in-process'] / (m['in-process'] + m['floor']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
