"""Speculative decoding (tiny checkpoints, fp32): greedy tokens with drafts equal transformers' and the plain
engine's, for every acceptance length (an oracle drafter right for a varying number of tokens, then wrong),
for k = 3 on the three structures and k = 1 and 8 (the tiny rings' slack) on the E4B-like one, with plain rows
decoding beside the verified ones, with the real prompt-lookup drafter, at TP=2; prefix reuse stays exact
after rejected drafts; sampled rows follow the target's distribution (chi-square on a small vocabulary); the
drafter and the settings' checks."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.config import EngineConfig
from neuron_workers.engine.acceptance import sampled_tokens, target_probs
from neuron_workers.engine.drafts import NgramIndex
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine
from neuron_workers.model.spec import Candidates

from conftest import NAMES, hf_greedy, hf_reference
from doubles.oracle_drafter import Oracle

CTX = 128
A = [2] + [(3 * i) % 50 + 5 for i in range(20)]
B = [2] + [(7 * i + 1) % 90 + 30 for i in range(13)]
C = [2, 40, 41, 42, 43]


def engine(path, k, **kw):
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(16, 64), max_batch=3,
                                     speculative_method="ngram", num_speculative_tokens=k, **kw))


def run(eng, jobs):
    """jobs: [(prompt, max_tokens, logprobs)] run together; the tokens of each."""
    seqs = [eng.new_sequence(p, SamplingParams(max_tokens=n, ignore_eos=True), logprobs=lp) for p, n, lp in jobs]
    toks = {s.seq_id: [] for s in seqs}
    for ev in eng.run_all(seqs):
        assert not hasattr(ev, "message"), ev
        toks[ev.seq_id].append(ev.token_id)
    return [toks[s.seq_id] for s in seqs]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_greedy_with_drafts_equals_transformers(name, tiny_dirs):
    ref = hf_reference(tiny_dirs[name])
    want = {tuple(p): hf_greedy(ref, p, 40) for p in (A, B, C)}
    for k in (1, 3, 8) if name == "gemma4-e4b-tiny" else (3,):  # every k on one structure (CI time)
        eng = engine(tiny_dirs[name], k)
        eng.drafter = Oracle(want, eng.dims.vocab_size)
        got = run(eng, [(A, 40, None), (B, 30, 2), (C, 25, None)])  # B asks logprobs: it decodes beside
        assert got == [want[tuple(A)], want[tuple(B)][:30], want[tuple(C)][:25]], f"{name} k={k}"
        assert 0 < eng.spec_accepted_tokens < eng.spec_draft_tokens, (k, eng.spec_accepted_tokens)
    plain = engine(tiny_dirs[name], 4)  # the real prompt-lookup drafter (random weights: mostly rejected)
    assert run(plain, [(A + A[1:], 30, None)]) == [hf_greedy(ref, A + A[1:], 30)]
    assert plain.spec_draft_tokens > 0


@pytest.mark.slow
def test_drafts_at_tp2_and_reuse_after_rejections(tiny_dirs):
    d = tiny_dirs["gemma4-e4b-tiny"]
    ref = hf_reference(d)
    want = {tuple(p): hf_greedy(ref, p, 40) for p in (A, C)}
    eng = engine(d, 3, tp=2, prefill_chunk=5)
    try:
        eng.drafter = Oracle(want, eng.dims.vocab_size)
        assert run(eng, [(A, 40, None), (C, 20, None)]) == [want[tuple(A)], want[tuple(C)][:20]]
        nxt = A + want[tuple(A)] + [77, 78, 79]  # the next turn: reuses A's slot, rejected drafts and all
        want[tuple(nxt)] = hf_greedy(ref, nxt, 12)
        assert run(eng, [(nxt, 12, None)]) == [want[tuple(nxt)]]
        assert eng.prefix.hit_tokens == len(A) + 39
    finally:
        eng.close()


@pytest.mark.slow
def test_chunk_steps_run_the_mixed_graph_and_drafts_resume_after(tiny_dirs):
    """With drafts and chunked prefill, a step that has a chunk runs the mixed graph (every decoding row one
    token beside the chunk, one graph) and no verify; once the prompt is in, verify steps resume. Greedy tokens
    equal transformers'."""
    d = tiny_dirs["gemma4-e4b-tiny"]
    ref = hf_reference(d)
    long = [2] + [(5 * i + 2) % 80 + 20 for i in range(60)]
    want = {tuple(p): hf_greedy(ref, p, 40) for p in (A, long)}
    eng = engine(d, 3, prefill_chunk=8)
    assert eng.mixed_steps
    eng.drafter = Oracle(want, eng.dims.vocab_size)
    a = eng.new_sequence(A, SamplingParams(max_tokens=40, ignore_eos=True))
    b = eng.new_sequence(long, SamplingParams(max_tokens=12, ignore_eos=True))
    toks, per_step, verifies = {a.seq_id: [], b.seq_id: []}, [], []
    eng.add(a)
    for step in range(60):
        if step == 4:  # A decodes (and verifies drafts) by now
            eng.add(b)
        chunking = b.slot is not None and not b.output_ids
        before = eng.spec_draft_tokens
        events = eng.step()
        for e in events:
            toks[e.seq_id].append(e.token_id)
        verifies.append(eng.spec_draft_tokens > before)
        if chunking and not a.finished:
            per_step.append((sum(e.seq_id == a.seq_id for e in events), verifies[-1]))
    assert [toks[a.seq_id], toks[b.seq_id]] == [want[tuple(A)], want[tuple(long)][:12]]
    assert len(per_step) >= 7 and set(per_step) == {(1, False)}  # 61 tokens in chunks of 8: A's one token, no verify
    assert "mixed_3x8" in eng.backend._graphs and any(verifies[:4]) and any(verifies[4 + len(per_step):])


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token the target gives no mass was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


CHI2_999 = {7: 24.32}  # the 99.9% quantile of chi-square with 7 degrees of freedom


@pytest.mark.parametrize("d0,d1", [(3, 5), (0, 0), (7, 2), (40, 1)])  # likely, top, unlikely, outside the top-k
def test_sampled_rows_follow_the_target_distribution(d0, d1):
    """Two verified positions over a small vocabulary: whatever the drafts, the first emitted token follows
    the target's p0 and, after an accepted first draft, the second follows p1."""
    gen = torch.Generator().manual_seed(1234)
    vocab, k = 64, 48
    logits = torch.randn(3, vocab, generator=gen) * 2
    values, ids = logits.sort(dim=1, descending=True)
    cands = Candidates(values[None, :, :k], ids[None, :, :k].to(torch.int32))
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.95)
    p0, i0 = target_probs(cands.values[0, 0], cands.ids[0, 0], params, 30.0)
    p1, i1 = target_probs(cands.values[0, 1], cands.ids[0, 1], params, 30.0)
    drafts = [int(i0[d0]) if d0 < 8 else d0, int(i1[d1])]
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for _ in range(12000):
        out = sampled_tokens(cands, 0, drafts, params, 30.0, gen)
        first[out[0]] += 1
        if out[0] == drafts[0] and len(out) > 1:
            second[out[1]] += 1
    full0, full1 = torch.zeros(vocab), torch.zeros(vocab)
    full0[i0.long()], full1[i1.long()] = p0, p1
    assert chi_square(first, full0) < CHI2_999[7]
    if second.sum() > 500:
        assert chi_square(second, full1) < CHI2_999[7]


def test_ngram_drafter_and_settings(tiny_dirs):
    ix = NgramIndex()
    assert ix.propose([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]  # the longest tail match, latest first
    assert ix.propose([1, 2, 3, 4, 5, 1, 2, 3, 9], 3) == []  # (3, 9) never occurred before
    assert NgramIndex().propose([5, 6, 7, 5, 6], 8) == [7, 5, 6]
    with pytest.raises(UserError) as e:
        engine(tiny_dirs["gemma4-e2b-tiny"], 9)  # past the tiny rings' slack (8)
    assert e.value.param == "num_speculative_tokens"
    with pytest.raises(UserError) as e:
        EngineConfig(model="x", num_speculative_tokens=2)
    assert e.value.param == "speculative_method"
    with pytest.raises(UserError) as e:
        EngineConfig(model="x", speculative_method="eagle")
    assert e.value.param == "speculative_method"
