"""Prefix reuse after reuse (tiny checkpoints: window 8, ring 16; fp32): a slot whose earlier occupant wrote further
than the sequence that reused it still holds those positions in its sliding rings, so the reach (how far the slot
was ever written) carries over to the next sequence. A, then B reusing most of A's history and stopping short of it,
then C matching B's history: C's greedy tokens equal transformers' on the three structures, at TP=2, and when B
is cancelled mid-chunk instead; a seeded bounded random mix of reuse, cancels, chunks and speculation in which
every sequence gives the tokens of its solo run on a cold engine; a seeded sampled row whose tokens depend neither
on its neighbours nor on speculation; a speculation setting the verify graph cannot serve refused at startup."""

from __future__ import annotations

import random

import pytest

from neuron_workers.config import EngineConfig
from neuron_workers.engine.events import ErrorEvent
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine

from conftest import NAMES, hf_greedy, hf_reference

CTX = 128
A = [2] + [(7 * i + 11) % 430 + 20 for i in range(39)]  # 40 tokens: past the ring (16)


def engine(path, **kw):
    """One slot, the rings alone (no kept windows: those would serve C from a kept point, `test_prefix_windows`)."""
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(16, 64, 128),
                                     max_batch=1, prefix_windows=0, **kw))


def greedy(eng, ids, n):
    return [e.token_id for e in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]


def new(n, salt):
    return [(17 * i + salt) % 400 + 30 for i in range(n)]


def check_abc(path, ref, **kw):
    """A writes its slot to position 61; B reuses 52 of A's history and ends at 54; C matches 46 of B's history:
    the rings still hold A's positions 55-60 over 39-44, so C must prefill in full."""
    eng = engine(path, **kw)
    try:
        a = greedy(eng, A, 21)
        hist = A + a[:-1]  # what the slot holds: 60 positions, and the parked row wrote position 60
        greedy(eng, hist[:53], 1)
        assert eng.prefix.hit_tokens == 52
        c_ids = hist[:46] + new(10, 3)
        assert greedy(eng, c_ids, 8) == hf_greedy(ref, c_ids, 8)
        assert eng.prefix.hit_tokens == 52  # C was not served from the overwritten rings
    finally:
        eng.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_reuse_after_reuse_matches_transformers(name, tiny_dirs):
    check_abc(tiny_dirs[name], hf_reference(tiny_dirs[name]))


@pytest.mark.slow
def test_reuse_after_reuse_at_tp2(tiny_dirs):
    d = tiny_dirs["gemma4-e4b-tiny"]
    check_abc(d, hf_reference(d), tp=2)


@pytest.mark.slow
def test_reuse_after_a_cancel_mid_chunk(tiny_dirs):
    """B reuses 53 of A's history, prefills one chunk of 5 and is cancelled (its slot keeps 58 positions); C
    matches 50 of them: A's positions 59-60 overwrote 43-44 in the rings, C needs them."""
    d = tiny_dirs["gemma4-12b-tiny"]
    ref = hf_reference(d)
    eng = engine(d, prefill_chunk=5)
    try:
        a = greedy(eng, A, 21)
        hist = A + a[:-1]
        b = eng.new_sequence(hist[:53] + new(20, 5), SamplingParams(max_tokens=4, ignore_eos=True))
        eng.add(b)
        eng.step()
        assert b.reused == 53 and b.prefilled == 58
        assert eng.cancel(b.seq_id)
        c_ids = (hist[:53] + new(20, 5))[:50] + new(9, 7)
        assert greedy(eng, c_ids, 8) == hf_greedy(ref, c_ids, 8)
    finally:
        eng.close()


def _random_prompt(rng: random.Random, pool: list[list[int]]) -> list[int]:
    """A new prompt, or a prefix of a recently finished sequence's prompt + output with a fresh tail: cut within
    the rings' slack of its end (reusable, if its slot still holds it) or anywhere."""
    if pool and len(pool[-1]) < 80 and rng.random() < 0.85:
        base = pool[-1]
        cut = len(base) - rng.randint(0, 8) if rng.random() < 0.8 else rng.randint(min(17, len(base)), len(base))
        tail = rng.randint(0, 12) if rng.random() < 0.7 else 0  # 0: the prompt repeats an earlier one's start
        return (base[:cut] + [rng.randint(20, 500) for _ in range(tail)])[:CTX - 30]
    return [2] + [rng.randint(20, 500) for _ in range(rng.randint(17, 44))]


class Mix:
    """Sequences added over time to one engine, their tokens, their cancels (after a number of steps) and the
    order they finished in."""

    def __init__(self, eng):
        self.eng, self.seqs, self.got, self.cancel_at, self.finished = eng, {}, {}, {}, []

    def add(self, ids: list[int], max_tokens: int, cancel_after: int | None) -> None:
        seq = self.eng.new_sequence(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        self.seqs[seq.seq_id], self.got[seq.seq_id] = seq, []
        if cancel_after:
            self.cancel_at[seq.seq_id] = cancel_after
        self.eng.add(seq)

    def histories(self) -> list[list[int]]:
        return [self.seqs[i].prompt_ids + self.got[i] for i in self.finished]

    def step(self) -> None:
        for ev in self.eng.step():
            assert not isinstance(ev, ErrorEvent), ev.message
            self.got[ev.seq_id].append(ev.token_id)
            if ev.final:
                self.finished.append(ev.seq_id)
        for seq_id, left in list(self.cancel_at.items()):
            self.cancel_at[seq_id] = left - 1
            if left == 1 and self.eng.cancel(seq_id):
                self.finished.append(seq_id)


@pytest.mark.slow
@pytest.mark.parametrize("name,spec,windows", [("gemma4-e2b-tiny", False, None), ("gemma4-e4b-tiny", True, 0),
                                               ("gemma4-12b-tiny", True, None), ("gemma4-12b-tiny", False, 0)])
def test_random_mix_equals_solo_runs(name, spec, windows, tiny_dirs):
    """Bounded and seeded: 40 greedy sequences over 2 slots, arriving over time, some cancelled after a random
    number of steps, chunked prefill (5), prompt-lookup speculation (k=3), kept windows (default) or the rings
    alone (0); each one's tokens (up to its cancel) equal its run alone on a cold engine without prefix reuse."""
    rng = random.Random(f"{name}{spec}")
    kw = dict(prefill_chunk=5, **(dict(speculative_method="ngram", num_speculative_tokens=3) if spec else {}))
    common = dict(model=str(tiny_dirs[name]), max_context=CTX, prefill_buckets=(16, 64, 128), **kw)
    eng, cold = build_engine(EngineConfig(max_batch=2, prefix_windows=windows, **common)), \
        build_engine(EngineConfig(max_batch=1, prefix_cache=False, **common))
    try:
        mix = Mix(eng)
        for _ in range(40):
            if rng.random() < 0.4:  # sometimes the engine drains first (its slots keep what they held)
                while eng.has_work:
                    mix.step()
            mix.add(_random_prompt(rng, mix.histories()), rng.choice([1, 2, rng.randint(3, 14)]),
                    rng.randint(1, 6) if rng.random() < 0.3 else None)
            for _ in range(rng.randint(0, 10)):
                mix.step()
        while eng.has_work:
            mix.step()
        assert sum(s.reused > 0 for s in mix.seqs.values()) >= 3  # the mix did reuse
        for seq in mix.seqs.values():
            solo = greedy(cold, seq.prompt_ids, seq.params.max_tokens)
            out = mix.got[seq.seq_id]
            assert out == solo[:len(out)], f"prompt of {len(seq.prompt_ids)}, reused {seq.reused}"
            if seq.seq_id not in mix.cancel_at:
                assert out == solo
    finally:
        eng.close()
        cold.close()


def _seeded(eng, prompt, seed, late: list[int] | None = None, at: int = 0) -> list[int]:
    """The tokens of a seeded sampled row (temperature 0.5, top-k 8), with `late` arriving after `at` steps."""
    params = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.5, top_k=8, seed=seed)
    seq = eng.new_sequence(prompt, params)
    eng.add(seq)
    out, steps = [], 0
    while eng.has_work:
        if late is not None and steps == at:
            eng.add(eng.new_sequence(late, SamplingParams(max_tokens=4, ignore_eos=True)))
        out += [e.token_id for e in eng.step() if e.seq_id == seq.seq_id]
        steps += 1
    return out


@pytest.mark.slow
def test_seeded_rows_do_not_depend_on_neighbours_or_speculation(tiny_dirs):
    """Same seed, same tokens: alone, beside a 60-token prompt chunked in 5s arriving at step 2 or 8, and with
    speculation off; the prompt repeats itself, so prompt-lookup drafts are made and verified."""
    d = tiny_dirs["gemma4-e4b-tiny"]
    prompt = [2] + [40 + i % 6 for i in range(30)]
    late = [2] + [(9 * i + 4) % 300 + 50 for i in range(59)]
    kw = dict(model=str(d), max_context=CTX, prefill_buckets=(16, 64, 128), max_batch=2, prefill_chunk=5)
    spec = build_engine(EngineConfig(speculative_method="ngram", num_speculative_tokens=4, **kw))
    plain = build_engine(EngineConfig(**kw))
    try:
        for seed in range(6):
            want = _seeded(plain, prompt, seed)
            assert _seeded(spec, prompt, seed) == want, seed
            assert _seeded(spec, prompt, seed, late, 2) == want, seed
            assert _seeded(spec, prompt, seed, late, 8) == want, seed
            assert _seeded(plain, prompt, seed, late, 2) == want, seed
        assert spec.spec_accepted_tokens > 0, spec.spec_draft_tokens  # verifies kept drafts: several tokens a step
    finally:
        spec.close()
        plain.close()


def test_speculative_tokens_past_the_verify_graph_refused_at_startup(tiny_dirs):
    """A ring that holds the whole context (max_context 16) never wraps, but the verify graph takes k + 1 <= 16
    tokens: k = 16 is refused at startup naming the field; k = 15 starts and serves a drafting request."""
    kw = dict(model=str(tiny_dirs["gemma4-e2b-tiny"]), max_context=16, prefill_buckets=(16,), max_batch=1,
              speculative_method="ngram")
    with pytest.raises(UserError) as e:
        build_engine(EngineConfig(num_speculative_tokens=16, **kw))
    assert e.value.param == "num_speculative_tokens" and "[0, 15]" in str(e.value)
    eng = build_engine(EngineConfig(num_speculative_tokens=15, **kw))
    try:
        toks = greedy(eng, [2, 40, 41, 42, 40, 41], 8)
        assert len(toks) == 8 and eng.spec_draft_tokens > 0
    finally:
        eng.close()
