"""Pacing: which requests' events the engine process (`serve_app.replica.engine_child`) sends the replica after a
step, and when it sends anything at all.

Every message crosses the socket between the two processes and wakes the replica's reader, and every
`Delta` the replica yields costs it, the router and the proxy more. One message per step cost a lone
request 2-8% of its engine time and the replica twice the CPU (`bench/engine_process.py`, 2 vCPUs: 94
messages for two 48-token requests against 2 to 10 paced). So events are held here and go out when a
message is due for their request:

- a request's last event (finished or failed), at once;
- a stream's first tokens, at once (time to first token);
- a stream's later tokens once its interval has passed since its last message: `stream_interval_ms`,
  longer when the replica's streams together would send more than `stream_messages_per_s` (they share
  that budget);
- a non-streaming request's tokens with its last event, in one message.

The engine thread holds and takes events; the process's main thread adds and drops requests. The
replica forwards whatever arrives: it has no pacing of its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Request:
    stream: bool
    items: list = field(default_factory=list)
    final: bool = False  # its last event is held
    sent_at: float | None = None  # when its last message went out (perf_counter); None: none yet


class Pacer:
    def __init__(self, interval_s: float, messages_per_s: float):
        self.interval_s, self.messages_per_s = interval_s, messages_per_s
        self.requests: dict[int, _Request] = {}
        self.streams = 0
        self.lock = threading.Lock()

    def add(self, rid: int, stream: bool) -> None:
        with self.lock:
            self.requests[rid] = _Request(stream)
            self.streams += stream

    def drop(self, rid: int) -> None:
        """The request is cancelled: its held events are never sent."""
        with self.lock:
            self._forget(rid)

    def hold(self, rid: int, item, final: bool) -> None:
        """Engine thread: one event of `rid` (dropped if the request is not, or no longer, added)."""
        with self.lock:
            req = self.requests.get(rid)
            if req is not None:
                req.items.append(item)
                req.final = req.final or final

    def interval(self) -> float:
        """Seconds between a stream's messages while `streams` streams run on this replica."""
        return max(self.interval_s, self.streams / self.messages_per_s)

    def take_due(self, now: float) -> list:
        """The held events whose messages are due at `now` (perf_counter), in order per request; a request
        whose last event goes is forgotten."""
        out = []
        with self.lock:
            interval = self.interval()
            for rid, req in list(self.requests.items()):
                if not req.items or not self._due(req, now, interval):
                    continue
                out += req.items
                req.items, req.sent_at = [], now
                if req.final:
                    self._forget(rid)
        return out

    @staticmethod
    def _due(req: _Request, now: float, interval: float) -> bool:
        if req.final:
            return True
        return req.stream and (req.sent_at is None or now - req.sent_at >= interval)

    def _forget(self, rid: int) -> None:
        req = self.requests.pop(rid, None)
        if req is not None:
            self.streams -= req.stream
