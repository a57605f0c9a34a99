"""The router's front door, as ASGI middleware: the API key and the request size limit, checked before
FastAPI reads or parses anything, so a 10 MB body costs a 413 and nothing else.

- API key: when keys are configured, every `/v1/*` request needs `Authorization: Bearer <key>` or (as
  Anthropic's clients send it) `x-api-key: <key>`; others get 401 in OpenAI's envelope (Anthropic's error shape
  on `/v1/messages`, as every refusal here). Keys are kept as SHA-256 digests and compared in constant time
  (`hmac.compare_digest`); `/health` and `/metrics` stay open.
- Size: a body over `max_request_bytes` is answered 413 from its Content-Length, or as soon as the
  streamed body passes the limit; a request head (path and headers) over `max_header_bytes` 431.
- Slow bodies: a body that has not fully arrived `body_timeout_s` after the request began is answered
  408 (a half-open request cannot hold a connection and a router slot for long). Idle connections are
  closed after `http_options.keep_alive_timeout_s` (by HAProxy with serve_app/ops/ray_env.py, else Serve's
  proxy); a connection that sends nothing, or its head slowly, is HAProxy's to close
  (`RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S`; Ray's proxy, uvicorn, has no timer): in production put the port
  behind a load balancer with tight ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024  # an image of 20 MiB in base64, and the rest
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
DEFAULT_BODY_TIMEOUT_S = 15.0


@dataclass
class GateSettings:
    key_digests: list[str] = field(default_factory=list)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S


SETTINGS = GateSettings()  # one router per process: its constructor fills this in


ANTHROPIC_TYPES = {401: "authentication_error", 408: "request_too_large", 413: "request_too_large",
                   431: "request_too_large"}


def anthropic_path(path: str) -> bool:
    return path.endswith("/v1/messages") or "/v1/messages/" in path


def _envelope(status: int, message: str, code: str, extra_headers=(), path: str = "") -> dict:
    if anthropic_path(path):
        err = {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "invalid_request_error"),
                                          "message": message}}
    else:
        err = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    body = json.dumps(err).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra_headers]
    return {"status": status, "headers": headers, "body": body}


async def _reply(send, r: dict) -> None:
    await send({"type": "http.response.start", "status": r["status"], "headers": r["headers"]})
    await send({"type": "http.response.body", "body": r["body"]})


def protected(path: str) -> bool:
    """The paths behind the API key: the OpenAI API and the tokenizer endpoints (health and metrics stay open)."""
    return "/v1/" in path or path.endswith(("/tokenize", "/detokenize"))


def authorized(headers: dict[bytes, bytes]) -> bool:
    if not SETTINGS.key_digests:
        return True
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    digests = [key_digest(token.strip()) if scheme.lower() == "bearer" else ""]
    if b"x-api-key" in headers:
        digests.append(key_digest(headers[b"x-api-key"].decode("latin-1").strip()))
    ok = False
    for digest in digests:
        for d in SETTINGS.key_digests:  # every digest compared: no early exit to time
            ok |= hmac.compare_digest(digest, d)
    return ok


class Gate:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw, path = scope.get("headers") or [], scope.get("path", "")
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + sum(
            len(k) + len(v) + 4 for k, v in raw)
        if head > SETTINGS.max_header_bytes:
            return await _reply(send, _envelope(431, f"the request head is larger than this server's limit of "
                                                f"{SETTINGS.max_header_bytes} bytes", "request_header_too_large",
                                                path=path))
        headers = dict(raw)
        if protected(path) and not authorized(headers):
            return await _reply(send, _envelope(401, "Incorrect or missing API key: send `Authorization: Bearer "
                                                "<key>` (or `x-api-key: <key>`).", "invalid_api_key",
                                                [(b"www-authenticate", b"Bearer")], path=path))
        limit = SETTINGS.max_request_bytes
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > limit:
            return await _reply(send, _too_large(limit, path))
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, total, deadline = [], 0, time.monotonic() + SETTINGS.body_timeout_s
        while True:
            try:
                msg = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                return await _reply(send, _envelope(408, f"the request body did not arrive within "
                                                    f"{SETTINGS.body_timeout_s:g} s", "request_timeout", path=path))
            if msg["type"] != "http.request":  # the client left
                return
            chunks.append(msg.get("body", b""))
            total += len(chunks[-1])
            if total > limit:
                return await _reply(send, _too_large(limit, path))
            if not msg.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _too_large(limit: int, path: str = "") -> dict:
    return _envelope(413, f"the request body is larger than this server's limit of {limit} bytes",
                     "request_too_large", path=path)
