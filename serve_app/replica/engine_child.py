"""The engine process's own side (`serve_app.replica.engine_process` starts it): it builds the replica's engine,
prepares each request (tokenize, validate, compile its grammar), runs the continuous-batching loop
(`EngineLoop`) and sends the events back as they fall due (`serve_app.replica.pacing`: a stream's first tokens and
every request's last event at once, a stream's other tokens once per interval, a non-streaming request's
with its last), at most one message per step.

Threads here: the main thread reads the replica's commands and prepares requests (a request that
cannot run is refused at once, a `Refused` event naming the param); the engine thread steps. Nothing of
Ray runs in this process, so the engine thread shares its interpreter lock with nothing but the reader.

Messages to the replica (pickled over the pipe):
- ("ready", info) once the engine is built, or ("error", message, code, param, user) if it cannot be;
- ("prepared", rid, prompt_tokens, in_thought) or ("refused", rid, Failed) per request;
- ("reply", rid, dict) or ("refused", rid, Failed) for a ("call", rid, (name, args)) (tokenize, detokenize);
- ("step", [(rid, event, logprob_entry, admitted_at, at), ...], StepStats, steps, decoded) after a step
  that made a request's message due or left the engine idle, after a step at least every STATS_PERIOD_S
  while it runs, and when cancels leave it idle; `at` is when the event was made, `steps` the steps so
  far, `decoded` the rows of each step since the last message (times are perf_counter's: one clock per
  host).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
import threading
import time
from multiprocessing.connection import Connection

from neuron_workers.engine.events import ErrorEvent, TokenEvent
from neuron_workers.engine.loop import EngineLoop, StepStats
from neuron_workers.errors import UserError
from serve_app.config import ModelSpec
from serve_app.events import Failed, GenerateRequest
from serve_app.replica import prepare
from serve_app.replica.host import pin, watch_parent
from serve_app.replica.media_inputs import MediaPolicy
from serve_app.replica.pacing import Pacer

log = logging.getLogger(__name__)
STATS_PERIOD_S = 0.2  # a running engine's counts reach the replica this often (its gauges: every 0.25 s)


def import_attr(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def main(fd: int) -> int:
    """`python -m serve_app.replica.engine_child FD`: FD is this process's end of the replica's socket pair.
    Returns the exit code."""
    conn = Connection(fd)
    try:
        _, spec, factory = conn.recv()
    except EOFError:  # the replica went away before it said what to build
        return 0
    spec_ = ModelSpec(**spec)
    try:
        cpus = pin(spec_)  # first: every thread and process started after this inherits the CPUs
        watch_parent()
        engine = import_attr(factory)(spec_)
    except UserError as e:
        conn.send(("error", str(e), e.code, e.param, True))
        return 1
    except Exception as e:  # a bug or a broken install: the replica reports it and fails to start
        log.exception("engine build failed")
        conn.send(("error", f"{type(e).__name__}: {e}", None, None, False))
        return 1
    child = EngineChild(conn, engine, spec_)
    child.send(("ready", {"max_context": engine.max_context, "max_batch": engine.max_batch, "cpus": cpus}))
    return child.serve()


class EngineChild:
    def __init__(self, conn, engine, spec: ModelSpec):
        self.conn, self.engine, self.spec = conn, engine, spec
        self.media_policy = MediaPolicy.of(spec)  # where image / audio URLs may be fetched from
        self.send_lock = threading.Lock()
        self.rids: dict[int, int] = {}  # request id -> sequence id
        self.seqs: dict[int, tuple[int, object]] = {}  # sequence id -> (request id, sequence)
        self.pacer = Pacer(spec.stream_interval_ms / 1e3, spec.stream_messages_per_s)
        self.decoded: list[int] = []  # rows of each step since the last message (engine thread only)
        self.sent_at = 0.0  # when the last step message went (engine thread only)
        self.loop = EngineLoop(engine, name=f"engine-{spec.name}", on_step=self._flush)

    def send(self, msg) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def serve(self) -> int:
        """Read commands until the replica closes the socket (or goes away), or the engine thread dies
        (then this process ends and the replica fails what it held). Returns the exit code."""
        code = 0
        try:
            while True:
                if not self.conn.poll(1.0):
                    if not self.loop.thread.is_alive():
                        log.error("the engine thread stopped")
                        code = 1
                        break
                    continue
                op, *args = self.conn.recv()
                if op == "add":
                    self._add(*args)
                elif op == "call":
                    self._call(*args)
                elif op == "cancel":
                    self._cancel(*args)
                elif op == "close":
                    break
        except (EOFError, OSError):
            pass
        except Exception:
            log.exception("the engine process failed")
            code = 1
        self.loop.close(timeout=1.0)
        if not self.loop.thread.is_alive():  # never under a step still running
            self.engine.close()
        return code

    def _add(self, rid: int, req: GenerateRequest) -> None:
        try:
            seq, in_thought = prepare.new_sequence(self.engine, req, self.media_policy)
        except UserError as e:
            self.send(("refused", rid, Failed(400, str(e), e.code, e.param)))
            return
        except Exception as e:  # ours: the request fails in shape, the process carries on
            log.exception("preparing request %d failed", rid)
            self.send(("refused", rid, Failed(500, f"internal error: {type(e).__name__}", "internal_error",
                                              type="server_error")))
            return
        self.rids[rid] = seq.seq_id
        self.seqs[seq.seq_id] = (rid, seq)
        self.pacer.add(rid, req.stream)
        self.send(("prepared", rid, len(seq.prompt_ids), in_thought))
        self.loop.submit(seq, self._sink)

    def _call(self, rid: int, call: tuple) -> None:
        """Tokenizer work for the replica (`prepare.tokenize` / `detokenize`), answered at once."""
        name, args = call
        try:
            if name == "tokenize":
                self.send(("reply", rid, prepare.tokenize(self.engine, *args, policy=self.media_policy)))
            elif name == "detokenize":
                self.send(("reply", rid, prepare.detokenize(self.engine, *args)))
            else:
                raise ValueError(f"no call {name!r}")
        except UserError as e:
            self.send(("refused", rid, Failed(400, str(e), e.code, e.param)))
        except Exception as e:  # ours: this call fails in shape, the process carries on
            log.exception("%s for request %d failed", name, rid)
            self.send(("refused", rid, Failed(500, f"internal error: {type(e).__name__}", "internal_error",
                                              type="server_error")))

    def _cancel(self, rid: int) -> None:
        seq_id = self.rids.pop(rid, None)
        self.pacer.drop(rid)
        if seq_id is not None:
            self.seqs.pop(seq_id, None)
            self.loop.cancel(seq_id)

    def _sink(self, ev) -> None:
        """Engine thread: hold the event until its message is due (with the logprob entry, token text
        included, so the replica needs no tokenizer)."""
        rid, seq = self.seqs.get(ev.seq_id, (None, None))
        if rid is None:
            return
        entry = None
        if isinstance(ev, TokenEvent) and ev.logprob is not None:
            try:
                entry = prepare.logprob_entry(self.engine.tokenizer, ev)
            except Exception:  # the token still goes out (a lost event would hang its request)
                log.exception("logprob entry failed for sequence %d", ev.seq_id)
        if isinstance(ev, TokenEvent) and ev.prompt_logprobs:  # the prompt's, wire-ready (the replica has no tokenizer)
            ev = dataclasses.replace(ev, prompt_logprobs=prepare.prompt_entries(self.engine.tokenizer, seq.prompt_ids,
                                                                               ev.prompt_logprobs))
        self.pacer.hold(rid, (rid, ev, entry, seq.admitted_at, time.perf_counter()), ev.final)
        if ev.final:
            self.seqs.pop(ev.seq_id, None)
            self.rids.pop(rid, None)

    def _flush(self, stats: StepStats) -> None:
        """Engine thread, after each step: send what is due, with the engine's counts."""
        self.decoded.append(stats.decoded)
        now = time.perf_counter()
        events = self.pacer.take_due(now)
        idle = not (stats.running or stats.waiting)
        if not (events or idle or now - self.sent_at >= STATS_PERIOD_S):
            return
        decoded, self.decoded, self.sent_at = tuple(self.decoded), [], now
        try:
            self.send(("step", events, stats, self.loop.steps, decoded))
        except OSError:  # the replica is gone: the reader sees the end of the socket
            pass
        except Exception:  # an event that does not pickle, say: the others still go, that request fails
            log.exception("sending step events failed; sending them request by request")
            self._send_apart(events, stats, decoded)

    def _send_apart(self, events: list[tuple], stats: StepStats, decoded: tuple) -> None:
        """One message per request; a request whose events cannot be sent ends with an error (never a hang)."""
        by_rid: dict[int, list[tuple]] = {}
        for e in events:
            by_rid.setdefault(e[0], []).append(e)
        for rid, evs in by_rid.items():
            try:
                self.send(("step", evs, stats, self.loop.steps, decoded))
            except OSError:
                return
            except Exception:
                log.exception("request %d: its events cannot be sent; it fails", rid)
                failed = ErrorEvent(evs[0][1].seq_id, "an event could not be sent to the replica")
                try:
                    self.send(("step", [(rid, failed, None, evs[0][3], time.perf_counter())], stats,
                               self.loop.steps, ()))
                except OSError:  # the replica is gone: the reader sees the end of the socket
                    return
                if not any(e[1].final for e in evs):
                    self._cancel(rid)
            decoded = ()  # counted once


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine %(levelname)s %(name)s: %(message)s")
    try:
        rc = main(int(sys.argv[1]))
    except BaseException:
        log.exception("the engine process failed")
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # no interpreter teardown: the engine thread may still hold native resources
