"""Drain: stop admitting, let in-flight requests finish, then end the rest in shape. Owns the router's
count of in-flight `/v1/*` requests (an ASGI middleware, so a stream counts until its last byte).

`Drain` wraps the router app. While `STATE.draining`, a new `/v1/*` request is answered 503
`shutting_down` with Retry-After (a load balancer or client retries elsewhere); `/health` says
"draining". `DrainState.drain()` (the router's `drain` method, called by `python -m serve_app.run` on
SIGINT/SIGTERM) waits up to `timeout_s` for the requests in flight to finish, then ends each one still
running: the request's task is cancelled (which cancels its sequence in the replica) and the middleware
finishes the response itself: a 503 `shutting_down` when nothing was sent yet, else one SSE
`data: {"error": ...}` event and `data: [DONE]`. A stream is never just cut.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

log = logging.getLogger("ray.serve")
SHUTDOWN_MESSAGE = "the server is shutting down; retry the request"


def _error(code: str) -> dict:
    return {"error": {"message": SHUTDOWN_MESSAGE, "type": "server_error", "param": None, "code": code}}


def cancelled(exc: BaseException) -> bool:
    """Whether an exception only says the request was cancelled (its client disconnected)."""
    from ray.exceptions import TaskCancelledError
    from ray.serve.exceptions import RequestCancelledError

    return isinstance(exc, (TaskCancelledError, RequestCancelledError, asyncio.CancelledError))


def proxy_gone(exc: BaseException) -> bool:
    """Whether Ray's HTTP proxy actor died under the request (plain `serve run` stopping on Ctrl-C kills it
    first): the connection, and with it the client, is gone; nothing is left to answer."""
    from ray.exceptions import RayActorError

    return isinstance(exc, RayActorError) and "ProxyActor" in str(exc)


class Flight:
    """One request in flight: its task and what of its response has gone out."""

    __slots__ = ("task", "_send", "started", "streaming", "done", "aborted")

    def __init__(self, send):
        self.task, self._send = asyncio.current_task(), send
        self.started = self.streaming = self.done = self.aborted = False

    async def send(self, msg: dict) -> None:
        if self.aborted:  # the request is being ended by the drain: its own output stops here
            return
        if msg["type"] == "http.response.start":
            self.started = True
            ctype = dict(msg.get("headers") or []).get(b"content-type", b"")
            self.streaming = ctype.startswith(b"text/event-stream")
        elif msg["type"] == "http.response.body" and not msg.get("more_body"):
            self.done = True
        await self._send(msg)

    def abort(self) -> None:
        if not self.done and not self.aborted:
            self.aborted = True
            self.task.cancel()

    async def finish_aborted(self) -> None:
        """End the response of an aborted request in shape."""
        if self.done:
            return
        if not self.started:
            body = json.dumps(_error("shutting_down")).encode()
            await self._send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1")]})
            await self._send({"type": "http.response.body", "body": body})
        elif self.streaming:
            tail = f"data: {json.dumps(_error('shutting_down'))}\n\ndata: [DONE]\n\n".encode()
            await self._send({"type": "http.response.body", "body": tail})
        else:  # a JSON answer cut between its head and body: nothing better can be said
            await self._send({"type": "http.response.body", "body": b""})
        self.done = True


class DrainState:
    def __init__(self):
        self.draining = False
        self.inflight: set[Flight] = set()
        self.timeout_s, self.abort_grace_s = 30.0, 2.0

    async def _wait_empty(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def drain(self, timeout_s: float | None = None) -> dict:
        """Stop admitting; wait for the requests in flight; end the rest. Returns the counts."""
        self.draining = True
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        at_start = list(self.inflight)
        log.info("draining: %d request(s) in flight, up to %.0f s to finish", len(at_start), timeout_s)
        await self._wait_empty(timeout_s)
        late = [f for f in self.inflight if not f.done]
        for f in late:
            f.abort()
        if late:
            log.warning("drain: ending %d request(s) still running after %.0f s", len(late), timeout_s)
        await self._wait_empty(self.abort_grace_s)
        # finished: answered whole; ended: by this drain, in shape; cut: gone without a whole answer (the
        # client left, or the server was stopped under them, e.g. by a second signal)
        finished = sum(f.done and not f.aborted for f in at_start)
        ended = sum(f.aborted for f in at_start)
        return {"in_flight": len(at_start), "finished": finished, "ended": ended,
                "cut": sum(not f.done for f in at_start if f not in self.inflight and not f.aborted),
                "left": len(self.inflight)}


STATE = DrainState()  # one router per process


class Drain:
    """ASGI middleware: counts `/v1/*` requests in flight and refuses new ones while draining."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or "/v1/" not in scope.get("path", ""):
            return await self.app(scope, receive, send)
        if STATE.draining:
            body = json.dumps(_error("shutting_down")).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"), (b"connection", b"close")]})
            return await send({"type": "http.response.body", "body": body})
        flight = Flight(send)
        STATE.inflight.add(flight)
        try:
            await self.app(scope, receive, flight.send)
        except asyncio.CancelledError:
            if not flight.aborted:
                raise
            flight.task.uncancel()
        except Exception as e:  # one line, not two tracebacks (ours and Serve's), for a proxy gone at shutdown
            if not proxy_gone(e):
                raise
            log.info("the HTTP proxy stopped under %s %s: the request ended with it", scope.get("method"),
                     scope.get("path"))
        finally:
            if not flight.aborted:
                STATE.inflight.discard(flight)
        if flight.aborted:
            try:
                try:
                    await flight.finish_aborted()
                except asyncio.CancelledError:  # the abort's cancel landed after the app had returned
                    await flight.finish_aborted()
            finally:
                STATE.inflight.discard(flight)
