"""Kept sliding windows on the Neuron path, through the SDK double (issue 40): `compile build --prefix-windows N`
makes the pool module state and traces `window_save`, `window_restore` and `slot_clone` (each reads and rewrites
its state, so the double links it as aliased state; the other graphs' state stays the KV alone); the manifest
records N; served from the artifacts, the three patterns real clients send reuse what they share past the rings
and give the cpu engine's greedy tokens in the same dtype; a server asking for another pool size is refused,
naming prefix_windows."""

from __future__ import annotations

import pytest

from compile.build import build
from neuron_workers.artifacts.manifest import Manifest
from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine

from doubles import neuron_double

pytestmark = pytest.mark.slow
CTX, BUCKETS = 192, (16, 64, 128, 192)
TURN, END, NL = 105, 106, 10


def turn(role: int, body: list[int]) -> list[int]:
    return [TURN, role, NL] + body + [END, NL]


def words(n: int, salt: int) -> list[int]:
    return [(13 * i + salt) % 380 + 120 for i in range(n)]


SYSTEM, GEN = [2] + turn(11, words(45, 1)), [TURN, 12, NL]


def patterns(eng) -> tuple[list, list]:
    """The three patterns (tests/engine/test_prefix_windows.py): tokens of each request and tokens it reused."""
    out, reused = [], []

    def run(ids, n):
        before = eng.prefix.hit_tokens
        out.append([e.token_id for e in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))])
        reused.append(eng.prefix.hit_tokens - before)

    p1 = SYSTEM + turn(13, words(12, 2)) + GEN
    run(p1, 14)
    run(SYSTEM + turn(13, words(9, 3)) + GEN, 6)
    p2 = p1 + turn(12, words(10, 4)) + turn(13, words(6, 5)) + GEN
    run(p2, 12)
    run(p2, 8)
    return out, reused


def test_neuron_build_keeps_windows_and_serves_the_three_patterns(tiny_dirs, tmp_path):
    d, out = tiny_dirs["gemma4-e2b-tiny"], tmp_path / "w"
    with neuron_double.installed() as calls:
        m = build(EngineConfig(str(d), "neuron", 1, CTX, BUCKETS, "bfloat16", artifacts=str(out), max_batch=2,
                               prefill_chunk=16, prefix_windows=4), progress=lambda _: None)
        assert Manifest.read(out).prefix_windows == m.prefix_windows == 4
        traces = {c[1]: c[3] for c in calls if c[0] == "trace"}  # tag -> {state buffer: written}
        for tag in ("window_save", "window_restore", "slot_clone"):  # each re-assigns the pool and every KV buffer
            assert tag in m.compiler_flags and all(traces[tag].values()) and any(n.startswith("pool_")
                                                                                for n in traces[tag]), tag
        assert not any(w for n, w in traces["decode"].items() if n.startswith("pool_"))  # not decode's state
        eng = build_engine(EngineConfig(str(d), "neuron", artifacts=str(out), max_context=CTX, max_batch=2))
        got, reused = patterns(eng)
        assert ("forward", "window_restore") in calls and ("forward", "window_save") in calls
        with pytest.raises(UserError) as e:
            build_engine(EngineConfig(str(d), "neuron", artifacts=str(out), max_context=CTX, max_batch=2,
                                      prefix_windows=6))
        assert e.value.param == "prefix_windows"
    cpu = build_engine(EngineConfig(str(d), "cpu", max_context=CTX, max_batch=2, prefill_buckets=BUCKETS,
                                    dtype="bfloat16", prefill_chunk=16, prefix_windows=4))
    want, cpu_reused = patterns(cpu)
    assert got == want and reused == cpu_reused and all(r > 40 for r in reused[1:]), (reused, cpu_reused)
