"""What the serving benches share: one /v1/completions request over HTTP, streamed or not, returning its
text (a stream's deltas joined), with either of two clients: httpx, or aiohttp (what vLLM's serving
benchmark uses; it takes a quarter to a half of httpx's CPU per request, CPU the server shares on one
host)."""

from __future__ import annotations

import contextlib
import json

CLIENTS = ("aiohttp", "httpx")


@contextlib.asynccontextmanager
async def client(kind: str, connections: int = 100):
    """An open client of `kind` with a pool of up to `connections` kept-alive connections."""
    if kind == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(timeout=300, limits=limits) as h:
            yield h
    else:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as h:
            yield h


def _texts(chunk: dict) -> list[str]:
    return [c["text"] for c in chunk["choices"]]


async def completion_text(h, url: str, body: dict) -> str:
    """`h`: a client from `client` (an httpx.AsyncClient or an aiohttp.ClientSession); `body`: the request,
    `stream` included."""
    if not hasattr(h, "stream"):  # aiohttp
        async with h.post(f"{url}/v1/completions", json=body) as r:
            r.raise_for_status()
            if not body.get("stream"):
                return _texts(await r.json())[0]
            parts = []
            async for line in r.content:  # one SSE line at a time
                if line.startswith(b"data: {"):
                    parts += _texts(json.loads(line[6:]))
            return "".join(parts)
    if not body.get("stream"):
        r = await h.post(f"{url}/v1/completions", json=body)
        r.raise_for_status()
        return _texts(r.json())[0]
    parts = []
    async with h.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                parts += _texts(json.loads(line[6:]))
    return "".join(parts)
