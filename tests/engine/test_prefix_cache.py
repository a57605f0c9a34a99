"""Prefix reuse (fp32 / fp64, tiny checkpoints: window 8, ring 16): a prompt that starts as an earlier sequence's
history prefills only the rest, and its greedy tokens equal transformers' whether the match is the whole
history (a chat turn), ends a few tokens before it (a divergent tail), is too far back for the sliding rings
(full prefill instead), after the kept slot idled through other rows' decode steps, with an odd chunk size (5)
and with chunking off, beside a decoding row, and at TP=2; seeded sampling is unchanged; the cache's slot
choice (the longest usable match, empty slots before evicting, LRU eviction) and FIFO admission."""

from __future__ import annotations

import pytest

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.prefix_cache import MIN_REUSE, PrefixCache, common_prefix
from neuron_workers.engine.scheduler import Scheduler
from neuron_workers.engine.sequence import Sequence
from neuron_workers.engine.stops import StopStrings
from neuron_workers.factory import build_engine

from conftest import NAMES, hf_greedy, hf_reference

CTX = 128
P1 = [2] + [(5 * i + 7) % 400 + 5 for i in range(39)]  # 40 tokens: past the ring (16)
OTHER = [2] + [(11 * i + 3) % 300 + 9 for i in range(20)]


def engine(path, chunk=None, **kw):
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(16, 64, 128),
                                     prefill_chunk=chunk, **kw))


def greedy(eng, ids, n):
    return [e.token_id for e in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]


def tail(n, salt):
    return [(13 * i + salt) % 350 + 20 for i in range(n)]


def check_turns(eng, ref, name):
    """Four prompts on one engine, each checked against transformers; returns the reused token counts."""
    hits, want = [], lambda ids, n: hf_greedy(ref, ids, n)

    def turn(ids, n):
        before = eng.prefix.hit_tokens
        got = greedy(eng, ids, n)
        assert got == want(ids, n), f"{name}: prompt of {len(ids)}"
        hits.append(eng.prefix.hit_tokens - before)
        return got

    a = turn(P1, 6)  # slot 0 keeps P1 + a[:-1] (45 positions)
    turn(OTHER, 20)  # slot 1: 20 decode steps while slot 0 idles, its row parked
    b_ids = P1 + a + tail(10, 1)  # the chat case: the whole kept history, then the next turn
    b = turn(b_ids, 12)
    kept_b = b_ids + b[:-1]
    turn(kept_b[:20] + tail(9, 2), 5)  # matches only 20 of 67 kept: the rings lost its window: full prefill
    turn(kept_b[:-5] + tail(7, 3), 8)  # ends 5 before the kept history: within the ring's slack
    return hits, len(P1 + a) - 1, len(kept_b) - 5


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_reuse_greedy_matches_transformers(name, tiny_dirs):
    ref = hf_reference(tiny_dirs[name])
    for chunk in (None, 5):  # None: chunking off (the rest of a match in extend_t = 16 pieces); 5: odd chunks
        eng = engine(tiny_dirs[name], chunk, max_batch=2)
        hits, whole, divergent = check_turns(eng, ref, f"{name} chunk {chunk}")
        assert hits == [0, 0, whole, 0, divergent], f"{name} chunk {chunk}"


@pytest.mark.slow
def test_reuse_beside_a_decoding_row_and_at_tp2(tiny_dirs):
    d = tiny_dirs["gemma4-e4b-tiny"]
    ref = hf_reference(d)
    for tp in (1, 2):
        eng = engine(d, 7, tp=tp, max_batch=3)
        try:
            a = greedy(eng, P1, 6)
            b_ids = P1 + a + tail(30, 4)
            p = SamplingParams(max_tokens=10, ignore_eos=True)
            seqs = [eng.new_sequence(OTHER, p), eng.new_sequence(b_ids, p)]
            toks = {s.seq_id: [] for s in seqs}
            for ev in eng.run_all(seqs):
                toks[ev.seq_id].append(ev.token_id)
            assert [toks[s.seq_id] for s in seqs] == [hf_greedy(ref, OTHER, 10), hf_greedy(ref, b_ids, 10)], tp
            assert eng.prefix.hit_tokens == len(P1) + 5 and seqs[1].reused == len(P1) + 5
        finally:
            eng.close()


@pytest.mark.slow
def test_seeded_sampling_unchanged_by_reuse(tiny_dirs):
    d = tiny_dirs["gemma4-e2b-tiny"]
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.0, top_k=40, seed=77)
    runs = []
    for cache in (False, True):
        eng = engine(d, dtype="float64", prefix_cache=cache)
        a = greedy(eng, P1, 4)
        runs.append([e.token_id for e in eng.generate(P1 + a + tail(5, 6), params)])
        assert eng.prefix is None or eng.prefix.hit_tokens == len(P1) + 3
    assert runs[0] == runs[1]


def test_cancelled_and_failed_sequences(tiny_dirs):
    """A cancelled sequence leaves what it prefilled; a failed one leaves nothing (its slot is not trusted)."""
    eng = engine(tiny_dirs["gemma4-e2b-tiny"], 8, max_batch=1)
    s = eng.new_sequence(P1, SamplingParams(max_tokens=4))
    eng.add(s)
    eng.step()  # one chunk of 8
    assert eng.cancel(s.seq_id) and eng.prefix.kept[0][0] == P1[:8]
    s = eng.new_sequence(P1, SamplingParams(max_tokens=4))
    eng.add(s)
    eng.step()
    eng._fail(s, RuntimeError("boom"))
    assert eng.prefix.kept == {}


def test_usable_rule_and_slot_choice():
    c = PrefixCache(window=8, ring=16)
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix(list(range(200)), list(range(150))) == 150
    assert c.usable(30, 16) and c.usable(5, 16)  # a history that fits the ring keeps every position
    assert c.usable(40, 49) and not c.usable(40, 50)  # else it may end at most ring - window past the match
    c.keep(3, list(range(100, 148)), reach=60)  # 48 kept; rejected drafts were written up to position 59
    assert c.match(list(range(100, 148)) + [0], 3) == (0, None)
    c.keep(3, list(range(100, 148)))
    assert c.match(list(range(100, 148)) + [0], 3) == (48, None)
    hist = list(range(100, 160))
    c.keep(0, hist[:30])
    c.keep(1, hist)
    c.keep(2, hist[:50])
    prompt = hist[:52] + [1, 2]
    assert c.match(prompt, 1) == (52, None) and c.match(prompt, 2) == (50, None) and c.match(prompt, 0) == (30, None)
    assert c.choose(prompt, [0, 1, 2, 3]) == (1, 52, None, None)
    assert c.match(hist[:MIN_REUSE - 1] + [0], 0) == (0, None)  # too short to be worth an extend
    assert c.match(hist[:30], 0) == (29, None)  # the last prompt token is always fed
    c.drop(3)
    assert c.choose([5] * 20, [0, 1, 2, 3]) == (3, 0, None, None)  # no match: an empty slot before evicting
    assert c.choose([5] * 20, [1, 2, 0]) == (0, 0, None, None)  # else the least recently used
    c.take(1, len(prompt), 52)
    assert 1 not in c.kept and (c.query_tokens, c.hit_tokens) == (54, 52)


def test_scheduler_reuse_keeps_fifo():
    def seq(ids):
        return Sequence(list(ids), SamplingParams(max_tokens=4), frozenset(), None, None, StopStrings([]))

    cache = PrefixCache(window=8, ring=16)
    sch = Scheduler(max_batch=2, prefill_tokens_per_step=64, chunk=0, prefix=cache, extend_t=16)
    hist = list(range(10, 50))
    cache.keep(1, hist)
    a, b = seq([7] * 30), seq(hist + [1] * 20)  # a first: it takes the empty slot 0, b then reuses slot 1
    sch.add(a)
    sch.add(b)
    assert sch.prefill_work() == [(a, 30), (b, 16)]  # b's 20-token rest in extend pieces of 16
    assert (a.slot, b.slot, b.reused, b.prefilled, sch.chunking) == (0, 1, 40, 40, b)
    c = seq(hist)
    sch.add(c)
    sch.prefilled(b, 16)
    assert sch.prefill_work() == [(b, 4)]  # no free slot: c waits its turn
