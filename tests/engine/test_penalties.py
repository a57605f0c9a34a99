"""Penalties and logit bias on the real graphs (fp32, tiny random-weight checkpoints): greedy tokens with
`repetition_penalty` equal transformers' `generate(repetition_penalty=...)`; with frequency / presence penalties
and a logit bias they equal transformers' `generate` with a logits processor that writes OpenAI's formula down
independently; the same whole, chunked by 6 (the extend and mixed graphs), beside an unpenalized row that keeps
its solo tokens, and beside rows that speculate. A bias of +100 forces a token, -100 bans one; logprobs stay the
model's; seeded sampling is reproducible and does not depend on its neighbours; bad values are 400-style errors
naming their field. The tests without a model (the formula, the sparse path against the dense one, the errors)
are fast, so the xla tier runs them on torch 2.9 too."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.penalties import Penalties
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine

from conftest import hf_greedy, hf_reference

CTX = 96
A = [2] + [(5 * i) % 60 + 7 for i in range(21)]  # 22 tokens: chunked by 6 it takes four pieces
B = [2, 40, 41, 42, 43, 40, 41]
NAMES = ["gemma4-e2b-tiny", "gemma4-12b-tiny"]


class OpenAIPenalties(LogitsProcessor):
    """The reference: a logit bias, then transformers' repetition penalty, then OpenAI's
    `mu - alpha_frequency * count - alpha_presence * [count > 0]` over the generated tokens only."""

    def __init__(self, n_prompt: int, params: SamplingParams):
        self.n_prompt, self.p = n_prompt, params

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for token, bias in self.p.logit_bias:
            scores[:, token] += bias
        if self.p.repetition_penalty != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(self.p.repetition_penalty)(input_ids, scores)
        for row in range(scores.shape[0]):
            counts = torch.bincount(input_ids[row, self.n_prompt:], minlength=scores.shape[1]).float()
            scores[row] -= self.p.frequency_penalty * counts + self.p.presence_penalty * (counts > 0).float()
        return scores


def hf_penalized(model, ids: list[int], params: SamplingParams) -> list[int]:
    n = params.max_tokens
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                         logits_processor=LogitsProcessorList([OpenAIPenalties(len(ids), params)]))
    return out[0, len(ids):].tolist()


def engine(path, **kw):
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(32, 96), max_batch=3, **kw))


def run(eng, jobs, **kw):
    seqs = [eng.new_sequence(p, params, **kw) for p, params in jobs]
    for ev in eng.run_all(seqs):
        assert not hasattr(ev, "message"), ev
    return [s.output_ids for s in seqs]


def greedy(n=24, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


PENALIZED = [dict(repetition_penalty=1.3), dict(repetition_penalty=0.7),
             dict(frequency_penalty=1.5, presence_penalty=0.5),
             dict(repetition_penalty=1.2, presence_penalty=-1.0, logit_bias=((7, 3.0), (12, -2.5)))]


@pytest.fixture(scope="module", params=NAMES)
def model(request, tiny_dirs):
    return request.param, tiny_dirs[request.param], hf_reference(tiny_dirs[request.param])


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [0, 6])
def test_greedy_tokens_equal_transformers(model, chunk):
    """Each penalized row beside a plain row (which keeps its solo tokens): whole prompts, and prompts chunked by
    6 beside decoding rows (the mixed graph) or alone (the extend graph)."""
    name, path, hf = model
    eng = engine(path, prefill_chunk=chunk)
    plain = hf_greedy(hf, B, 24)
    changed = 0
    for kw in PENALIZED:
        params = greedy(**kw)
        want = hf_penalized(hf, A, params)
        if kw == PENALIZED[0]:
            ref = hf.generate(torch.tensor([A]), do_sample=False, max_new_tokens=24, min_new_tokens=24,
                              pad_token_id=0, repetition_penalty=1.3)[0, len(A):].tolist()
            assert want == ref  # the reference's repetition rule is transformers' own
        assert run(eng, [(B, greedy()), (A, params)]) == [plain, want], (name, kw)
        assert run(eng, [(A, params)]) == [want], (name, kw)
        changed += want != hf_greedy(hf, A, 24)
    assert changed >= 3  # the penalties change the tokens: the comparison can fail


@pytest.mark.slow
def test_penalized_rows_beside_speculating_rows(model):
    """With prompt-lookup speculation a penalized row never speculates (it decodes beside the verify); both rows'
    tokens are transformers'."""
    name, path, hf = model
    eng = engine(path, speculative_method="ngram", num_speculative_tokens=3)
    params = greedy(frequency_penalty=0.8, repetition_penalty=1.1)
    loop = [2] + [40, 41, 42, 43] * 4
    assert run(eng, [(loop, greedy()), (A, params)]) == [hf_greedy(hf, loop, 24), hf_penalized(hf, A, params)]
    assert eng.spec_draft_tokens > 0


@pytest.mark.slow
def test_logit_bias_forces_and_bans(model):
    name, path, hf = model
    eng = engine(path)
    plain = hf_greedy(hf, A, 24)
    assert run(eng, [(A, greedy(logit_bias=((99, 100.0),)))]) == [[99] * 24]  # the soft-cap bounds logits at 30
    banned = plain[0]
    got = run(eng, [(A, greedy(logit_bias=((banned, -100.0),)))])[0]
    assert banned not in got and got == hf_penalized(hf, A, greedy(logit_bias=((banned, -100.0),)))


@pytest.mark.slow
def test_logprobs_stay_the_models(model):
    """The chosen tokens follow the penalty; their logprobs are the log-softmax of the model's own soft-capped
    logits at each position (transformers' forward over the prompt and the tokens before)."""
    name, path, hf = model
    eng = engine(path)
    params = greedy(n=12, repetition_penalty=1.5)
    seq = eng.new_sequence(A, params, logprobs=2)
    events = list(eng.run_all([seq]))
    assert seq.output_ids == hf_penalized(hf, A, params)
    with torch.no_grad():
        logits = hf(torch.tensor([A + seq.output_ids[:-1]])).logits[0, len(A) - 1:]
    lp = torch.log_softmax(logits.float(), -1)
    want = lp.gather(1, torch.tensor(seq.output_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([e.logprob for e in events]), want, rtol=1e-4, atol=1e-4)
    assert [e.top[0][0] for e in events] == lp.argmax(-1).tolist()  # the model's best, not the penalized one


@pytest.mark.slow
def test_seeded_sampling_is_reproducible_and_independent_of_neighbours(model):
    name, path, hf = model
    eng = engine(path)
    params = SamplingParams(max_tokens=20, temperature=1.0, top_k=40, seed=5, ignore_eos=True, frequency_penalty=2.0,
                            presence_penalty=1.0)
    alone = run(eng, [(A, params)])[0]
    beside = run(eng, [(B, SamplingParams(max_tokens=20, temperature=0.8, seed=1)), (A, params),
                       (B, greedy(n=9))])[1]
    assert alone == beside == run(eng, [(A, params)])[0]
    unpenalized = run(eng, [(A, SamplingParams(max_tokens=20, temperature=1.0, top_k=40, seed=5, ignore_eos=True))])
    assert alone != unpenalized[0]


def test_the_formula_on_a_vector():
    """bias, then repetition over prompt and output, then frequency and presence over the output."""
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                            logit_bias=((0, 1.0), (3, -4.0)))
    pen = Penalties(params, [1, 2], 6)
    for t in (2, 4, 4):
        pen.add(t)
    z = torch.tensor([1.0, 2.0, -2.0, 3.0, 6.0, 5.0])
    want = torch.tensor([2.0, 1.0, -4.0 - 0.75, -1.0, 3.0 - 1.25, 5.0])
    torch.testing.assert_close(pen.apply(z), want)
    assert z.tolist() == [1.0, 2.0, -2.0, 3.0, 6.0, 5.0]  # the step's logits are not changed in place


@pytest.mark.parametrize("vocab,prompt", [(262_144, 3000), (512, 900)])
def test_the_sparse_path_equals_the_dense_one(vocab, prompt):
    """Greedy and top-k rows look only at the touched ids and the best untouched ones: the same token and the same
    top k as the whole penalized vocabulary (the real vocabulary, and a tiny one whose every id is touched)."""
    from neuron_workers.engine.distribution import penalized_candidates, sample_full_row
    from neuron_workers.engine.rows import Row, soft_cap

    g = torch.Generator().manual_seed(0)
    params = SamplingParams(repetition_penalty=1.7, frequency_penalty=0.9, presence_penalty=-0.4,
                            logit_bias=((3, 40.0), (vocab - 1, -20.0)))
    pen = Penalties(params, torch.randint(0, vocab, (prompt,), generator=g).tolist(), vocab)
    for _ in range(12):
        raw = torch.randn(vocab, generator=g) * 20
        dense = pen.apply(soft_cap(raw, 30.0))
        assert sample_full_row(raw, Row(0, params, None, penalty=pen), 30.0).token == int(dense.argmax())
        for k in (1, 64, min(1024, vocab)):
            z, ids = penalized_candidates(raw, pen, k, 30.0)
            top = torch.topk(z, k)
            want = torch.topk(dense, k)
            torch.testing.assert_close(top.values, want.values, rtol=0, atol=0)
            assert set(ids[top.indices].tolist()) == set(want.indices.tolist())
        pen.add(int(torch.randint(0, vocab, (), generator=g)))


@pytest.mark.parametrize("kw,param", [(dict(repetition_penalty=0.0), "repetition_penalty"),
                                      (dict(repetition_penalty=101.0), "repetition_penalty"),
                                      (dict(frequency_penalty=2.5), "frequency_penalty"),
                                      (dict(presence_penalty=-2.01), "presence_penalty"),
                                      (dict(presence_penalty=float("nan")), "presence_penalty"),
                                      (dict(logit_bias=((3, 101.0),)), "logit_bias"),
                                      (dict(logit_bias=((-1, 1.0),)), "logit_bias"),
                                      (dict(logit_bias=((3, 1.0), (3, 2.0))), "logit_bias"),
                                      (dict(logit_bias=tuple((i, 1.0) for i in range(1025))), "logit_bias"),
                                      (dict(logit_bias={3: 1.0}), "logit_bias"),
                                      (dict(logit_bias=(([3], 1.0),)), "logit_bias"),
                                      (dict(logit_bias=((3, 1.0, 2.0),)), "logit_bias"),
                                      (dict(logit_bias=((3, True),)), "logit_bias")])
def test_bad_values_name_their_field(kw, param):
    with pytest.raises(UserError) as e:
        SamplingParams(**kw)
    assert e.value.param == param


@pytest.mark.slow
def test_a_bias_outside_the_vocabulary_is_refused(tiny_dirs):
    eng = engine(tiny_dirs["gemma4-e2b-tiny"])
    with pytest.raises(UserError) as e:
        eng.new_sequence(A, greedy(logit_bias=((512, 1.0),)))
    assert e.value.param == "logit_bias" and "[0, 512)" in str(e.value)


@pytest.mark.slow
def test_a_repetition_penalty_in_generation_config_is_the_default(tiny_dirs, tmp_path):
    """transformers' `generate` applies generation_config's repetition_penalty; so does a request that leaves it
    unset (the replica starts from `sampling_defaults`)."""
    path = shutil.copytree(tiny_dirs["gemma4-12b-tiny"], tmp_path / "ckpt")
    gen = path / "generation_config.json"
    cfg = json.loads(gen.read_text()) if gen.is_file() else {}
    gen.write_text(json.dumps({**cfg, "do_sample": False, "repetition_penalty": 1.3}))
    eng = engine(path)
    assert eng.sampling_defaults == {"temperature": 0.0, "repetition_penalty": 1.3}
    hf = hf_reference(path)
    want = hf_greedy(hf, A, 24)
    assert run(eng, [(A, greedy(**eng.sampling_defaults))]) == [want] != [run(eng, [(A, greedy())])[0]]
    gen.write_text(json.dumps({**cfg, "repetition_penalty": "1.3"}))
    with pytest.raises(UserError, match="repetition_penalty must be a positive number"):
        engine(path)  # the checkpoint's mistake, said once at load, not a 400 on every request
