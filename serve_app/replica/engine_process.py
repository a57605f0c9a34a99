"""EngineProcess: a replica's engine in a process of its own (`serve_app.replica.engine_child` runs there).

Why a process: the engine's host side (graph calls, sampling, grammar masks, detokenization) is Python
that needs the interpreter lock every few microseconds, and so do Ray Serve's request handling, the
replica's event loop and its metrics. In one process every arriving request and every message slows the
engine's steps and waits for them (measured by bench/serve_efficiency.py). Here the engine shares its
lock with nothing of Ray; the replica relays requests and events and does no per-token work.

The child is a fresh interpreter (`python -m serve_app.replica.engine_child`: not a fork of a process with Ray's
threads, not multiprocessing's spawn, which would re-run the replica's main module) with the replica's
environment and import path, so NEURON_RT_VISIBLE_CORES, which Ray set for the replica, pins the child
to the replica's cores, and its output goes where the replica's stdout / stderr go (the worker's log
files). Commands go down a socket pair as pickled messages, written by a writer thread (a large prompt
never blocks the event loop); events come back as their messages fall due (`serve_app.replica.pacing`), read
by one thread that hands each event to its request's sink. The child ends when the socket closes or
its parent is gone (it checks while it loads), so it does not outlive its replica.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable

from neuron_workers.engine.events import ErrorEvent
from neuron_workers.errors import UserError
from serve_app.events import Failed, GenerateRequest

log = logging.getLogger("ray.serve")
START_TIMEOUT_S = 1800.0  # a 12B load from artifacts on a cold disk takes minutes, not hours


@dataclass(frozen=True, slots=True)
class Prepared:
    """The request is tokenized and queued in the engine."""

    prompt_tokens: int
    in_thought: bool = False  # the rendered prompt ends inside a thought channel
    final: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """The engine process refused the request before it ran (a 400, or an error preparing it)."""

    failed: Failed
    final: bool = True


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to tokenizer work (`submit(..., op="call")`)."""

    result: dict
    final: bool = True


@dataclass(frozen=True, slots=True)
class Token:
    """One engine event of a running request, with what only the engine process could compute."""

    event: object  # neuron_workers.engine.events.TokenEvent | ErrorEvent
    logprob_entry: dict | None  # OpenAI's shape for this token's logprobs, when asked
    admitted_at: float | None  # when the sequence got its batch slot (perf_counter: one clock per host)
    at: float | None = None  # when the engine made it (perf_counter); None: an event of this process's own

    @property
    def final(self) -> bool:
        return self.event.final


class EngineProcess:
    def __init__(self, spec, on_step: Callable | None = None):
        self.name, self.on_step = spec.name, on_step
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "serve_app.replica.engine_child", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(("start", spec.model_dump(), spec.engine))
        self.info = self._wait_ready()
        self.max_context, self.max_batch = self.info["max_context"], self.info["max_batch"]
        self.requests: dict[int, Callable] = {}  # request id -> sink
        self.stats = None  # the latest StepStats
        self.steps, self.closing, self.dead = 0, False, False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # `dead` and `requests` against the reader's last sweep
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.writer = threading.Thread(target=self._write, name=f"engine-writer-{spec.name}", daemon=True)
        self.reader = threading.Thread(target=self._read, name=f"engine-reader-{spec.name}", daemon=True)
        self.writer.start()
        self.reader.start()

    def _wait_ready(self) -> dict:
        if not self.conn.poll(START_TIMEOUT_S):
            self.proc.kill()
            raise RuntimeError(f"the engine of {self.name} did not start within {START_TIMEOUT_S:.0f} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"the engine process of {self.name} exited while starting (exit code "
                               f"{self._reap()}); its traceback is in this replica's log") from None
        if msg[0] == "ready":
            return msg[1]
        _, message, code, param, user = msg
        self._reap()
        raise UserError(message, code, param) if user else RuntimeError(message)

    def _reap(self, timeout: float = 5.0) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def alive(self) -> bool:
        # `dead` first: the reader sets it before it fails the held requests, while the killed process may
        # not be reaped yet (poll() None) and the reader thread is still finishing its sweep.
        return not self.dead and self.proc.poll() is None and self.reader.is_alive()

    def submit(self, req: GenerateRequest | tuple, sink: Callable, op: str = "add") -> int:
        """Send a request to the engine; its events (`Refused`, or `Prepared` then `Token`s) go to
        `sink`, which is called on the reader thread (so it only hands off). Returns the id `cancel` takes.
        With op "call", `req` is (name, args) of tokenizer work and `sink` gets one `Reply` or `Refused`."""
        rid = next(self._ids)
        with self._lock:
            if not self.dead:
                self.requests[rid] = sink
        if self.dead:  # the engine process is gone: the request fails at once
            sink(Token(ErrorEvent(-1, "the engine process stopped"), None, None))
        else:
            self._send((op, rid, req))
        return rid

    def cancel(self, rid: int) -> None:
        if self.requests.pop(rid, None) is not None:
            self._send(("cancel", rid))

    def _send(self, msg) -> None:
        self._outbox.put(msg)

    def _write(self) -> None:
        while (msg := self._outbox.get()) is not None:
            try:
                self.conn.send(msg)
            except OSError:  # the engine process is gone: the reader fails every request
                return

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                try:
                    self._dispatch(msg)
                except Exception:  # ours (a sink, metrics): this message's requests may hang, not all of them
                    log.exception("engine message failed: %s", msg[0])
        except (EOFError, OSError):
            pass
        finally:
            if not self.closing:
                log.error("the engine process of %s stopped (exit code %s)", self.name, self.proc.poll())
            with self._lock:
                self.dead = True
                held = list(self.requests)
            for rid in held:
                self._deliver(rid, Token(ErrorEvent(-1, "the engine process stopped"), None, None))

    def _dispatch(self, msg) -> None:
        op = msg[0]
        if op == "step":
            _, events, stats, steps, decoded = msg
            for rid, ev, entry, admitted_at, at in events:
                self._deliver(rid, Token(ev, entry, admitted_at, at))
            self.steps, self.stats = steps, stats
            if self.on_step is not None:
                self.on_step(stats, decoded)
        elif op == "prepared":
            self._deliver(msg[1], Prepared(msg[2], msg[3]))
        elif op == "reply":
            self._deliver(msg[1], Reply(msg[2]))
        elif op == "refused":
            self._deliver(msg[1], Refused(msg[2]))

    def _deliver(self, rid: int, item) -> None:
        sink = self.requests.get(rid)
        if sink is None:
            return
        if item.final:
            self.requests.pop(rid, None)
        try:
            sink(item)
        except Exception:  # a sink whose consumer is gone must not stop the reader
            log.exception("event sink failed for request %d", rid)

    def close(self, timeout: float = 5.0) -> None:
        self.closing = True
        self._send(("close",))
        self._send(None)  # then the writer stops
        self._reap(timeout)
        self.reader.join(timeout)  # it sees the end of the socket and fails whatever was left
        # the writer has sent its last message or failed on the dead socket: closing under it would let a
        # late write land on whatever socket reuses the descriptor (another engine's first message)
        self.writer.join(timeout)
        self.conn.close()
