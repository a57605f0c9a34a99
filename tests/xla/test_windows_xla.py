"""Kept sliding windows on the xla twin (tier `-m xla`): the pool is module state and save / restore / clone are
graphs of their own over it (`model/window_graphs.py`), so the three patterns real clients send (a shared system
turn with a new question, a next turn whose answer re-renders differently, the same prompt again) reuse what they
share past the rings, and every greedy token equals the cpu backend's in fp32, for the E2B- and 12B-like structures;
each window graph is one program (its indices are inputs, never constants)."""

from __future__ import annotations

import pytest

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.factory import build_engine

from conftest import NAMES

pytestmark = pytest.mark.xla
pytest.importorskip("torch_xla")

CTX = 192
TURN, END, NL = 105, 106, 10  # as tests/engine/test_prefix_windows.py: the tiny tokenizer's control ids


def turn(role: int, body: list[int]) -> list[int]:
    return [TURN, role, NL] + body + [END, NL]


def words(n: int, salt: int) -> list[int]:
    return [(13 * i + salt) % 380 + 120 for i in range(n)]


SYSTEM, GEN = [2] + turn(11, words(45, 1)), [TURN, 12, NL]


def greedy(eng, ids, n):
    return [e.token_id for e in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]


def engine(path, backend: str):
    return build_engine(EngineConfig(model=str(path), backend=backend, max_context=CTX, max_batch=2,
                                     prefill_buckets=(16, 64, 128, 192), prefix_cache=True, prefix_windows=4))


def tokens_and_reuse(eng) -> tuple[list, list]:
    out, reused = [], []

    def run(ids, n):
        before = eng.prefix.hit_tokens
        out.append(greedy(eng, ids, n))
        reused.append(eng.prefix.hit_tokens - before)

    p1 = SYSTEM + turn(13, words(12, 2)) + GEN
    run(p1, 14)
    run(SYSTEM + turn(13, words(9, 3)) + GEN, 6)
    p2 = p1 + turn(12, words(10, 4)) + turn(13, words(6, 5)) + GEN
    run(p2, 12)
    run(p2, 8)
    return out, reused


@pytest.mark.parametrize("name", [n for n in NAMES if "e4b" not in n])  # E4B: E2B's structure, wider
def test_three_patterns_reuse_on_the_xla_twin_and_equal_the_cpu_backend(tiny_dirs, name):
    cpu, xla = engine(tiny_dirs[name], "cpu"), engine(tiny_dirs[name], "xla")
    want, cpu_reused = tokens_and_reuse(cpu)
    got, xla_reused = tokens_and_reuse(xla)
    assert got == want
    assert xla_reused == cpu_reused and all(r > 40 for r in xla_reused[1:]), xla_reused
    assert xla.prefix.windows.restored == 3
    compiled = {k: v for k, v in xla.backend.compiles.items() if k.startswith(("window", "slot"))}
    assert compiled and all(n <= 1 for n in compiled.values()), compiled
