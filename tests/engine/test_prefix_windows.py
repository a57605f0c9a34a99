"""Kept sliding windows (tiny checkpoints: window 8, ring 16, so every prompt here is far past the rings' slack):
the three patterns real clients send reuse most of what they share with an earlier request and give
transformers' greedy tokens: a shared system turn with a new question, a next turn whose previous answer
re-renders differently, the same prompt again; on the three structures, with chunked prefill, with speculative
decoding and at TP=2; eviction when the pool is full; a one-token difference before a kept point is never served
from it; the keep points and the pool's bookkeeping."""

from __future__ import annotations

import pytest

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.prefix_windows import WindowPool, keep_points
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine

from conftest import NAMES, hf_greedy, hf_reference

CTX = 192
TURN, END, NL = 105, 106, 10  # <|turn>, <turn|> (the tiny tokenizer has Gemma-4's control ids), a newline


def turn(role: int, body: list[int]) -> list[int]:
    return [TURN, role, NL] + body + [END, NL]


def words(n: int, salt: int) -> list[int]:
    return [(13 * i + salt) % 380 + 120 for i in range(n)]


SYSTEM = [2] + turn(11, words(45, 1))  # 51 tokens: the shared system turn
GEN = [TURN, 12, NL]  # the generation prompt


def engine(path, **kw):
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(16, 64, 128, 192),
                                     **{"max_batch": 2, **kw}))


def greedy(eng, ids, n):
    return [e.token_id for e in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]


def patterns(eng, ref, name):
    """The three patterns on one engine; each checked against transformers; (shared, reused) of each."""
    out = []

    def run(ids, n, shared):
        before = eng.prefix.hit_tokens
        got = greedy(eng, ids, n)
        assert got == hf_greedy(ref, ids, n), f"{name}: prompt of {len(ids)}"
        out.append((shared, eng.prefix.hit_tokens - before))
        return got

    p1 = SYSTEM + turn(13, words(12, 2)) + GEN
    a1 = run(p1, 14, 0)
    run(SYSTEM + turn(13, words(9, 3)) + GEN, 6, len(SYSTEM) + 3)  # 1: same system turn, a new question
    rerendered = turn(12, words(10, 4))  # 2: the answer as the template re-renders it, not the generated ids
    p2 = p1 + rerendered + turn(13, words(6, 5)) + GEN
    a2 = run(p2, 12, len(p1))
    run(p2, 8, len(p2) - 1)  # 3: the same prompt again (after its 12-token answer)
    assert a1 and a2
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_three_patterns_reuse_and_match_transformers(name, tiny_dirs):
    ref = hf_reference(tiny_dirs[name])
    for kw in ({}, {"prefill_chunk": 5}):
        eng = engine(tiny_dirs[name], **kw)
        try:
            got = patterns(eng, ref, f"{name} {kw}")
            for shared, reused in got[1:]:
                assert reused >= 0.75 * shared, (name, kw, got)
            assert eng.prefix.windows.restored == 3 and eng.prefix.window_hit_tokens > 0
        finally:
            eng.close()
    cold = engine(tiny_dirs[name], prefix_windows=0)  # the rings alone: none of the three is usable
    try:
        assert [reused for _, reused in patterns(cold, ref, f"{name} rings")[1:]] == [0, 0, 0]
    finally:
        cold.close()


@pytest.mark.slow
def test_patterns_with_speculation_and_at_tp2(tiny_dirs):
    d = tiny_dirs["gemma4-e4b-tiny"]
    ref = hf_reference(d)
    for kw in ({"speculative_method": "ngram", "num_speculative_tokens": 3, "prefill_chunk": 7}, {"tp": 2}):
        eng = engine(d, **kw)
        try:
            got = patterns(eng, ref, str(kw))
            assert all(reused >= 0.75 * shared for shared, reused in got[1:]), (kw, got)
        finally:
            eng.close()


@pytest.mark.slow
def test_one_token_difference_before_a_kept_point_is_never_served(tiny_dirs):
    """The slot keeps windows at the system turn's end and at its prompt's last position but one; a prompt
    that differs from its history at position d reuses at most d tokens (a kept point at or before d, else
    none), and its tokens are exact."""
    d = tiny_dirs["gemma4-12b-tiny"]
    ref = hf_reference(d)
    eng = engine(d, max_batch=1)
    try:
        p = SYSTEM + turn(13, words(12, 2)) + GEN
        greedy(eng, p, 10)
        for pos in (3, 30, len(SYSTEM) - 1, len(SYSTEM) + 5, len(p) - 2):
            q = list(p)
            q[pos] = (q[pos] + 1) % 500 + 5 if q[pos] not in (TURN, END) else 400
            before = eng.prefix.hit_tokens
            assert greedy(eng, q, 6) == hf_greedy(ref, q, 6), pos
            assert eng.prefix.hit_tokens - before <= pos, pos
            greedy(eng, p, 10)  # the slot holds p again (its windows re-kept)
    finally:
        eng.close()


@pytest.mark.slow
def test_eviction_when_the_pool_is_full(tiny_dirs):
    """One entry: each new prompt's windows evict the last one's; a prompt whose window was evicted prefills
    in full (exact), a prompt whose window is still kept reuses it."""
    d = tiny_dirs["gemma4-e2b-tiny"]
    ref = hf_reference(d)
    eng = engine(d, max_batch=1, prefix_windows=1)
    try:
        p = SYSTEM + turn(13, words(12, 2)) + GEN  # keeps the system turn's end, then its end evicts it
        greedy(eng, p, 10)
        assert eng.prefix.windows.evicted == 1 and eng.prefix.windows.holds(0, len(p) - 1)
        q = SYSTEM + turn(13, words(9, 3)) + GEN
        before = eng.prefix.hit_tokens
        assert greedy(eng, q, 6) == hf_greedy(ref, q, 6)
        assert eng.prefix.hit_tokens == before  # the system turn's window is gone: a full prefill
        before = eng.prefix.hit_tokens
        assert greedy(eng, q, 6) == hf_greedy(ref, q, 6)
        assert eng.prefix.hit_tokens - before == len(q) - 1  # q's own last window is kept
    finally:
        eng.close()


def test_keep_points_pool_and_settings(tiny_dirs):
    chat = SYSTEM + turn(13, words(12, 2)) + GEN
    assert keep_points(chat, END, 16, 16) == (len(SYSTEM), len(chat) - 1)
    assert keep_points(words(40, 1), END, 16, 16) == (32, 39)  # no turns: the last chunk boundary, the end
    assert keep_points(words(40, 1), None, 0, 16) == (39,)
    assert keep_points(words(10, 1), END, 16, 16) == ()  # too short to be worth keeping
    pool = WindowPool(2)
    a, b = pool.claim(0, 20), pool.claim(0, 40)
    assert pool.best(0, 39) == (20, a) and pool.best(0, 45) == (40, b) and pool.best(0, 19) is None
    pool.touch(a)
    c = pool.claim(1, 30)  # full: evicts b, the least recently used
    assert c == b and not pool.holds(0, 40) and pool.holds(1, 30) and pool.evicted == 1
    pool.invalidate(0, 19)
    assert pool.best(0, 100) is None and len(pool.free) == 1
    for bad in (-1, "2"):
        with pytest.raises(UserError) as e:
            EngineConfig(model="x", prefix_windows=bad)
        assert e.value.param == "prefix_windows"
    eng = engine(tiny_dirs["gemma4-e2b-tiny"], max_batch=3)
    try:
        assert eng.prefix.windows.entries == 6  # the default: 2 a slot
    finally:
        eng.close()


@pytest.mark.slow
def test_twins_prefill_once(tiny_dirs):
    """Four sequences with one prompt at once (a request's n choices): the first prefills it, the others wait a
    step and clone its slot (prompt tokens but the last reused); greedy tokens equal transformers', and seeded
    samples equal the same seeds run one at a time on a cold engine."""
    d = tiny_dirs["gemma4-12b-tiny"]
    ref = hf_reference(d)
    prompt = SYSTEM + turn(13, words(12, 2)) + GEN
    eng, cold = engine(d, max_batch=4), engine(d, max_batch=1, prefix_cache=False)
    try:
        greedy_p = SamplingParams(max_tokens=8, ignore_eos=True)
        seeded = lambda i: SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, top_k=20, seed=5 + i)
        for choice in (lambda i: greedy_p, seeded):
            before = eng.prefix.hit_tokens
            seqs = [eng.new_sequence(prompt, choice(i)) for i in range(4)]
            toks = {s.seq_id: [] for s in seqs}
            for ev in eng.run_all(seqs):
                toks[ev.seq_id].append(ev.token_id)
            assert [s.reused for s in seqs[1:]] == [len(prompt) - 1] * 3
            assert eng.prefix.hit_tokens - before >= 3 * (len(prompt) - 1)
            for i, s in enumerate(seqs):
                want = hf_greedy(ref, prompt, 8) if choice(i).greedy else \
                    [e.token_id for e in cold.generate(prompt, choice(i))]
                assert toks[s.seq_id] == want, i
    finally:
        eng.close()
        cold.close()
