"""Chunked prefill through the extend graph (fp32 / fp64, tiny checkpoints): greedy tokens equal transformers' with odd
and even chunk sizes, while another sequence decodes beside the chunks (one chunk per step, the other row gets a
token every step, both in one mixed graph), at TP=1 and TP=2; the mixed graph equals a decode step and an extend step
run one after the other, also beside a logprobs row (its `_logits` variant); seeded sampling is unchanged; a chunk
whose inputs fail ends alone; the scheduler keeps FIFO order, one chunk per step and cancels at a chunk boundary. The
extend graph's per-position candidates equal decode steps one token at a time, and it writes nothing outside its
rows' new positions."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.scheduler import Scheduler
from neuron_workers.engine.sequence import Sequence
from neuron_workers.engine.stops import StopStrings
from neuron_workers.factory import build_engine
from neuron_workers.model.extend_inputs import extend_inputs
from neuron_workers.model.host_inputs import prefill_inputs

from conftest import NAMES, hf_greedy, hf_reference

CTX = 128
LONG = [2] + [(7 * i + 3) % 400 + 5 for i in range(44)]  # 45 tokens: past the window (8) and the ring (16)
SHORT = [2, 17, 9, 33, 5]


def engine(path, chunk, **kw):
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(16, 64), prefill_chunk=chunk,
                                     **kw))


def run_beside(eng, n_short=30, n_long=20):
    """SHORT decodes; LONG arrives at step 2 and is prefilled in chunks beside it. Tokens of both, and the
    steps at which SHORT got no token while LONG was being prefilled."""
    p = SamplingParams
    a = eng.new_sequence(SHORT, p(max_tokens=n_short, ignore_eos=True))
    b = eng.new_sequence(LONG, p(max_tokens=n_long, ignore_eos=True))
    toks, gaps, step = {a.seq_id: [], b.seq_id: []}, 0, 0
    eng.add(a)
    while eng.has_work:
        if step == 2:
            eng.add(b)
        events = eng.step()
        got = {e.seq_id for e in events}
        gaps += b.slot is not None and not b.output_ids and a.seq_id not in got and not a.finished
        for e in events:
            toks[e.seq_id].append(e.token_id)
        step += 1
    return toks[a.seq_id], toks[b.seq_id], gaps


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_chunked_greedy_matches_transformers(name, tiny_dirs):
    ref = hf_reference(tiny_dirs[name])
    want_short, want_long = hf_greedy(ref, SHORT, 30), hf_greedy(ref, LONG, 20)
    for chunk in (5, 13, 16):
        eng = engine(tiny_dirs[name], chunk, max_batch=2)
        assert eng.prefill_chunk == chunk
        short, long, gaps = run_beside(eng)
        assert (short, long, gaps) == (want_short, want_long, 0), f"{name} chunk {chunk}"
        assert f"mixed_2x{chunk}" in eng.backend._graphs  # the chunks ran in the mixed graph with SHORT's tokens
    solo = engine(tiny_dirs[name], 7, max_batch=1)
    assert [e.token_id for e in solo.generate(LONG, SamplingParams(max_tokens=20, ignore_eos=True))] == want_long


@pytest.mark.slow
def test_chunked_tp2_matches_transformers(tiny_dirs):
    d = tiny_dirs["gemma4-e4b-tiny"]
    want = hf_greedy(hf_reference(d), LONG, 16)
    eng = engine(d, 7, tp=2, max_batch=2)
    try:
        short, long, gaps = run_beside(eng, 20, 16)
        assert long == want and gaps == 0
        assert short == hf_greedy(hf_reference(d), SHORT, 20)
    finally:
        eng.close()


@pytest.mark.slow
def test_seeded_sampling_unchanged_by_chunks(tiny_dirs):
    d = tiny_dirs["gemma4-e2b-tiny"]
    params = SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, top_k=40, seed=1234)
    runs = [[e.token_id for e in engine(d, c, dtype="float64").generate(LONG, params)] for c in (0, 9)]
    assert runs[0] == runs[1]


def _seq(n):
    return Sequence(list(range(n)), SamplingParams(max_tokens=4), frozenset(), None, None, StopStrings([]))


def test_scheduler_one_chunk_per_step_fifo_and_cancel():
    sch = Scheduler(max_batch=4, prefill_tokens_per_step=12, chunk=8)
    a, b, c, d = _seq(20), _seq(3), _seq(30), _seq(2)
    for s in (a, b, c, d):
        sch.add(s)
    assert sch.prefill_work() == [(a, 8), (b, 3)]  # a's first chunk, then b: 11 of the 12-token budget
    sch.prefilled(a, 8)
    assert sch.prefill_work() == [(a, 8)]  # c is long while a chunks, and d waits behind c (FIFO)
    sch.prefilled(a, 8)
    assert sch.prefill_work(decode_rows=1) == [(a, 4)]  # a's last chunk: still one chunk per step
    sch.prefilled(a, 4)
    assert sch.chunking is None
    assert sch.prefill_work(decode_rows=3) == [(c, 8)]  # d (2) would pass 12 - 3 decoding rows - 8
    assert sch.cancel(c.seq_id) is c and sch.chunking is None and c.slot in sch.free_slots
    assert sch.prefill_work() == [(d, 2)]
    e = _seq(40)
    sch.add(e)
    assert sch.prefill_work(decode_rows=50) == [(e, 8)]  # over budget, but one unit always runs


@pytest.mark.slow
def test_extend_per_position_equals_decode_steps_and_touches_only_its_positions(tiny_dirs):
    from neuron_workers.backends.cpu import CpuBackend
    from neuron_workers.model.host_inputs import DecodeBatch
    from neuron_workers.model.loader import load_model
    from neuron_workers.model.spec import DECODE, PREFILL

    model = load_model(tiny_dirs["gemma4-e2b-tiny"], torch.float32)
    prompt, new = LONG[:20], [11, 12, 13, 14, 15]

    def fresh():
        be = CpuBackend(model.hf_lm, model.dims, 64, (32,), max_batch=3)
        for slot in (0, 1, 2):  # every slot holds something; slot 1 is ours
            ids = prompt if slot == 1 else [3 + slot] * 9
            be.prefill(32, prefill_inputs(be.spec(PREFILL, 32), ids, model.ple, 8, slot))
        return be

    ext = fresh()
    before = [t.clone() for t in ext.kv]
    spec = ext.extend_spec(8, 1, per_position=True)
    out = ext.extend(spec, extend_inputs(spec, [(1, new, len(prompt))], model.ple, 8))
    assert out.values.shape == (1, 8, ext.candidates)
    for b, a in zip(before, ext.kv):  # slots 0 and 2 untouched; slot 1 only at the 5 new positions
        assert torch.equal(b[[0, 2]], a[[0, 2]])
        n = b.shape[2]
        changed = (b[1] != a[1]).any(-1).any(0).nonzero().flatten().tolist()
        assert set(changed) <= {p % n for p in range(20, 25)}
    dec = fresh()
    batch = DecodeBatch(dec.spec(DECODE), model.ple, 8)
    batch.start(1, len(prompt))
    for i, tok in enumerate(new):
        logits = dec.decode(batch.inputs([(1, tok, len(prompt) + i)]))[1]
        assert int(logits.argmax()) == int(out.ids[0, i, 0])
        top = logits.topk(16).values
        assert torch.allclose(top, out.values[0, i, :16], atol=1e-4)
    for a, b in zip(ext.kv, dec.kv):  # slot 1 holds the same cache afterwards (decode's free rows wrote junk)
        assert torch.allclose(a[1], b[1], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head", ["candidates", "logits", "hidden"])
def test_mixed_graph_equals_a_decode_step_then_the_chunk(name, head, tiny_dirs):
    """One mixed graph (every slot's decode token + a 5-token chunk padded to T = 8) gives the decode step's
    candidates (or logits) for the decoding slots, the extend graph's for the chunk's last position, and the same
    KV buffers as the two graphs run one after the other (the chunking slot's decode row parked at the chunk);
    its `_h` variant (beside an MTP drafter) also the hidden states of `decode_h` and `extend_1x8_h`."""
    from neuron_workers.backends.cpu import CpuBackend
    from neuron_workers.model.extend_inputs import mixed_inputs
    from neuron_workers.model.host_inputs import DecodeBatch
    from neuron_workers.model.loader import load_model
    from neuron_workers.model.spec import DECODE, PREFILL

    model = load_model(tiny_dirs[name], torch.float32)
    prompt, chunk, window = LONG[:20], [11, 12, 13, 14, 15], model.dims.sliding_window
    heads = {0: [3, 4, 5, 6, 7, 8, 9, 10, 11], 2: [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]}

    logits = head == "logits"

    def fresh():
        be = CpuBackend(model.hf_lm, model.dims, 64, (32,), max_batch=3)
        be.hidden_states = head == "hidden"  # as with an MTP drafter attached: the `_h` candidate graphs
        batch = DecodeBatch(be.spec(DECODE), model.ple, window)
        for slot, ids in [(0, heads[0]), (1, prompt), (2, heads[2])]:
            be.prefill(32, prefill_inputs(be.spec(PREFILL, 32), ids, model.ple, window, slot))
            batch.start(slot, len(ids))
        batch.park(1, len(prompt))  # slot 1 is being prefilled in chunks: its next chunk starts at 20
        return be, batch

    decoding = [(0, 21, len(heads[0])), (2, 22, len(heads[2]))]
    ref, batch = fresh()
    dec = ref.decode(batch.inputs(decoding)) if logits else ref.decode_candidates(batch.inputs(decoding))
    ext_spec = ref.extend_spec(8, 1, logits=logits)
    ext = ref.extend(ext_spec, extend_inputs(ext_spec, [(1, chunk, len(prompt))], model.ple, window))

    mix, batch = fresh()
    spec = mix.mixed_spec(8, logits=logits)
    assert spec.tag == "mixed_3x8" + {"candidates": "", "logits": "_logits", "hidden": "_h"}[head]
    decode = dict(zip(batch.names, batch.inputs(decoding)))
    one = ref.extend_spec(8, 1)
    rows = {x.name: v for x, v in zip(one.host_inputs, extend_inputs(one, [(1, chunk, len(prompt))], model.ple,
                                                                     window))}
    out = mix.extend(spec, mixed_inputs(spec, decode, rows))
    got, want_dec, want_ext = (out, dec, ext) if logits else (out.values, dec.values, ext.values)
    assert got.shape[0] == 4  # slots 0, 1, 2, then the chunk's last position
    # fp32: the linear layers see 11 tokens instead of 3 or 8 (another summation order), so ~1e-4 apart
    assert torch.allclose(got[[0, 2]], want_dec[[0, 2]], atol=2e-3)
    assert torch.allclose(got[3], want_ext[0], atol=2e-3)
    if not logits:
        assert torch.equal(out.ids[[0, 2], :8], dec.ids[[0, 2], :8]) and torch.equal(out.ids[3, :8], ext.ids[0, :8])
    if head == "hidden":  # [B + 1, H], as the values
        assert out.hidden.shape == (4, model.dims.hidden_size) and dec.hidden is not None and ext.hidden is not None
        assert torch.allclose(out.hidden[[0, 2]], dec.hidden[[0, 2]], atol=2e-3)
        assert torch.allclose(out.hidden[3], ext.hidden[0], atol=2e-3)
    else:
        assert logits or out.hidden is None
    for a, b in zip(mix.kv, ref.kv):  # the same summation-order noise (1.8e-5 seen on the 12B-like one)
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


@pytest.mark.slow
def test_mixed_steps_run_beside_logprobs_rows_and_equal_separate_graphs(tiny_dirs):
    """A chunked prompt beside two decoding rows, one of which asks for logprobs (the `_logits` mixed graph):
    the same tokens and logprobs with the mixed graph and with two graphs a step, greedy tokens equal
    transformers', and the mixed graphs did run."""
    d = tiny_dirs["gemma4-e4b-tiny"]
    ref = hf_reference(d)
    runs = []
    for mixed in (True, False):
        eng = engine(d, 13, max_batch=3)
        eng.mixed_steps = mixed
        p = SamplingParams
        a = eng.new_sequence(SHORT, p(max_tokens=24, ignore_eos=True))
        b = eng.new_sequence([2, 9, 8, 7], p(max_tokens=24, ignore_eos=True), logprobs=2)
        c = eng.new_sequence(LONG, p(max_tokens=12, ignore_eos=True))
        toks = {s.seq_id: [] for s in (a, b, c)}
        lps = []
        eng.add(a), eng.add(b)
        for step in range(40):
            if step == 2:
                eng.add(c)
            for e in eng.step():
                toks[e.seq_id].append(e.token_id)
                lps += [e.logprob] if e.seq_id == b.seq_id else []
        tags = set(eng.backend._graphs)
        assert any(t.startswith("mixed_3x13") for t in tags) == mixed, tags
        assert ("mixed_3x13_logits" in tags) == mixed
        runs.append(([toks[s.seq_id] for s in (a, b, c)], lps))
    assert runs[0][0] == runs[1][0]
    assert runs[0][0] == [hf_greedy(ref, SHORT, 24), hf_greedy(ref, [2, 9, 8, 7], 24), hf_greedy(ref, LONG, 12)]
    assert torch.allclose(torch.tensor(runs[0][1]), torch.tensor(runs[1][1]), atol=1e-3)  # fp32 summation order


def test_a_mixed_step_whose_chunk_inputs_fail_ends_only_that_sequence(tiny_dirs, monkeypatch):
    """A host-side failure building the chunk's inputs (here a ContextLengthError forced into `extend_inputs`)
    fails the chunking sequence with an error event; the decoding row gets its token that step and its greedy
    tokens stay transformers'."""
    from neuron_workers.engine import prefill
    from neuron_workers.errors import ContextLengthError

    d = tiny_dirs["gemma4-e2b-tiny"]
    eng = engine(d, 5, max_batch=2)
    p = SamplingParams
    a = eng.new_sequence(SHORT, p(max_tokens=12, ignore_eos=True))
    b = eng.new_sequence(LONG, p(max_tokens=4, ignore_eos=True))
    eng.add(a)
    toks, errors = [], []
    for step in range(16):
        if step == 2:
            eng.add(b)
            monkeypatch.setattr(prefill, "extend_inputs", lambda *a, **k: (_ for _ in ()).throw(
                ContextLengthError("forced")))
        for e in eng.step():
            (errors if hasattr(e, "message") else toks).append(e)
    assert [e.seq_id for e in errors] == [b.seq_id] and "forced" in errors[0].message
    assert [e.token_id for e in toks if e.seq_id == a.seq_id] == hf_greedy(hf_reference(d), SHORT, 12)
    assert b.finished and b.seq_id not in eng.scheduler.running
