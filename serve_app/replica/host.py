"""The engine process's place on its host: the CPUs it runs on (`ModelSpec.engine_cpus`) and the replica that
started it (it ends when that process is gone)."""

from __future__ import annotations

import logging
import os
import threading
import time

from neuron_workers.errors import UserError
from serve_app.config import ModelSpec

log = logging.getLogger(__name__)


def resolve_cpus(wanted: list[int], allowed: list[int]) -> list[int]:
    """`ModelSpec.engine_cpus` on a host where this process may run on `allowed` (sorted): non-negative
    entries are CPU numbers, negative ones count from the end of `allowed`, wrapping."""
    out = set()
    for c in wanted:
        if c < 0:
            out.add(allowed[c % len(allowed)])
        elif c in allowed:
            out.add(c)
        else:
            raise UserError(f"engine_cpus: CPU {c} is not one this replica may run on ({allowed}); a negative "
                            f"entry counts from the end of those", "invalid_value", "engine_cpus")
    return sorted(out)


def pin(spec: ModelSpec) -> list[int] | None:
    """Run this thread, and the threads and processes it starts from now on, on `spec.engine_cpus`; returns
    the CPUs, None when unset or where the OS has no CPU affinity."""
    if not spec.engine_cpus:
        return None
    if not hasattr(os, "sched_setaffinity"):
        log.warning("engine_cpus ignored: this OS does not let a process choose its CPUs")
        return None
    cpus = resolve_cpus(spec.engine_cpus, sorted(os.sched_getaffinity(0)))
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        raise UserError(f"engine_cpus: cannot run on CPUs {cpus}: {e}", "invalid_value", "engine_cpus") from None
    if len(cpus) < spec.tp:
        log.warning("engine_cpus gives a tp-%d engine %d CPU(s): its %d rank processes share them", spec.tp,
                    len(cpus), spec.tp)
    return cpus


def watch_parent(period_s: float = 1.0) -> None:
    """End this process if the replica that started it is gone (killed while the engine loads, say: nobody
    reads the socket then, and the cores it holds are wanted by the replica's replacement)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
