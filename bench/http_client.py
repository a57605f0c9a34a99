"""What the serving benches share: one /v1/completions request over HTTP, streamed or not, returning its
text (a stream's deltas joined)."""

from __future__ import annotations

import json


async def completion_text(h, url: str, body: dict) -> str:
    """`h`: an httpx.AsyncClient; `body`: the request, `stream` included."""
    if not body.get("stream"):
        r = await h.post(f"{url}/v1/completions", json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]
    parts = []
    async with h.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                parts += [c["text"] for c in json.loads(line[6:])["choices"]]
    return "".join(parts)
