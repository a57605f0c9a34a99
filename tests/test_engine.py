"""Engine loop, sampling and host-input bookkeeping, against a scripted fake backend (no model)."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.detok import IncrementalDetokenizer
from neuron_workers.dims import SLIDING
from neuron_workers.engine import Engine
from neuron_workers.errors import ContextLengthError, UserError
from neuron_workers.host_inputs import choose_bucket, default_buckets, prefill_masks, ring_index
from neuron_workers.params import SamplingParams
from neuron_workers.sampling import sample, soft_cap

VOCAB = 64


class FakeBackend:
    """Logits that favour `script[i]` at step i; records the positions it was asked to decode."""

    def __init__(self, script, max_context=32, buckets=(8, 32)):
        self.script, self.max_context, self.buckets, self.max_batch = list(script), max_context, buckets, 1
        self.calls, self.positions = [], []

    def spec(self, phase, bucket=1):
        from neuron_workers.spec import make_spec

        return make_spec(FakeDims, phase, 1, bucket, self.max_context)

    def _logits(self):
        z = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(len(self.calls)))
        z[0, self.script[min(len(self.calls), len(self.script) - 1)]] += 20
        self.calls.append(len(self.calls))
        return z

    def prefill(self, bucket, inputs):
        self.bucket = bucket
        return self._logits()

    def decode(self, inputs):
        self.positions.append(int(inputs[1][0, 0]))
        return self._logits()

    def close(self):
        pass


class FakeDims:
    vocab_size, num_layers, ple_dim, sliding_window = VOCAB, 1, 0, 4
    final_logit_softcapping, kv_layers, layer_types = 30.0, (), (SLIDING,)

    @staticmethod
    def ring_size(max_context):
        return min(4, max_context)


class FakeModel:
    dims, ple, tokenizer, eos_token_ids = FakeDims, None, None, (1,)

    class info:
        model_dir = "fake"
        sampling_defaults = {}


def run(script, n=10, **kw):
    backend = FakeBackend(script)
    events = list(Engine(FakeModel, backend).generate([5, 6, 7], SamplingParams(max_new_tokens=n, **kw)))
    return [e.token_id for e in events], events, backend


def test_greedy_follows_logits_and_stops_at_eos():
    ids, events, backend = run([9, 8, 1, 7])
    assert ids == [9, 8, 1] and events[-1].finish_reason == "stop"
    assert backend.positions == [3, 4]  # decode positions continue after the 3-token prompt
    assert backend.bucket == 8


def test_max_tokens_and_ignore_eos():
    ids, events, _ = run([9, 1, 1, 1], n=3, ignore_eos=True)
    assert ids == [9, 1, 1] and events[-1].finish_reason == "length"
    assert [e.finish_reason for e in events[:-1]] == [None, None]


def test_stop_token_ids():
    ids, events, _ = run([9, 8, 7, 6], stop_token_ids=(7,))
    assert ids == [9, 8, 7] and events[-1].finish_reason == "stop"


def test_same_seed_same_samples_and_temperature_zero_is_greedy():
    a = sample_seq(seed=11)
    assert a == sample_seq(seed=11)
    assert a != sample_seq(seed=12)
    logits = torch.randn(VOCAB)
    assert sample(logits, SamplingParams(temperature=0.0), 30.0, None) == int(logits.argmax())


def sample_seq(seed, n=30):
    from neuron_workers.sampling import make_generator

    g = make_generator(seed)
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9)
    return [sample(logits, params, 30.0, g) for _ in range(n)]


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(VOCAB)
    g = torch.Generator().manual_seed(0)
    assert sample(logits, SamplingParams(temperature=1.0, top_k=1), 30.0, g) == int(logits.argmax())
    assert sample(logits, SamplingParams(temperature=1.0, top_p=1e-6), 30.0, g) == int(logits.argmax())


def test_soft_cap_fp32_and_monotone():
    z = torch.tensor([-200.0, -1.0, 0.0, 1.0, 200.0], dtype=torch.bfloat16)
    capped = soft_cap(z, 30.0)
    assert capped.dtype == torch.float32 and capped.abs().max() <= 30.0
    assert torch.all(capped[1:] > capped[:-1])


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(temperature=3), dict(top_p=0), dict(top_k=-2),
                                dict(max_new_tokens=0)])
def test_bad_sampling_params(kw):
    with pytest.raises(UserError):
        SamplingParams(**kw)


def test_prompt_over_context_is_a_clear_error():
    backend = FakeBackend([9])
    eng = Engine(FakeModel, backend)
    with pytest.raises(ContextLengthError, match="context is 32"):
        list(eng.generate(list(range(2, 30)), SamplingParams(max_new_tokens=8)))
    with pytest.raises(UserError, match="token ids"):
        list(eng.generate([2, 999], SamplingParams(max_new_tokens=2)))
    assert backend.calls == []


def test_buckets():
    assert default_buckets(256) == (32, 64, 128, 256)
    assert default_buckets(100) == (32, 64, 100)
    assert choose_bucket(33, (32, 64)) == 64 and choose_bucket(32, (32, 64)) == 32
    with pytest.raises(ContextLengthError):
        choose_bucket(65, (32, 64))


def test_ring_index_takes_last_position_per_slot():
    assert ring_index(3, 8).tolist() == [0, 1, 2, 0, 0, 0, 0, 0]
    assert ring_index(13, 8).tolist() == [8, 9, 10, 11, 12, 5, 6, 7]
    assert ring_index(16, 8).tolist() == list(range(8, 16))


def test_prefill_masks_window_and_padding():
    full, sliding = prefill_masks(5, 8, 3, torch.float32)
    ok_full, ok_sl = full[0, 0] == 0, sliding[0, 0] == 0
    assert ok_full[4].tolist() == [True] * 5 + [False] * 3  # last real row sees all 5 real keys
    assert ok_sl[4].tolist() == [False, False, True, True, True, False, False, False]  # (q-3, q]
    assert not ok_full[2, 3]  # causal
    assert torch.isfinite(full).all()  # finfo.min, never -inf


def test_incremental_detokenizer_equals_full_decode(tiny_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["gemma4-e2b-tiny"]))
    ids = tok("Hello, wörld! ✓ The capital of France is Paris.", add_special_tokens=False)["input_ids"]
    d = IncrementalDetokenizer(tok)
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) + d.flush() == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces)


def test_sampling_follows_the_distribution_and_top_p_cuts_the_tail():
    from neuron_workers.sampling import make_generator

    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    g = make_generator(1)
    counts = torch.zeros(3)
    for _ in range(6000):
        counts[sample(logits, SamplingParams(temperature=1.0), None, g)] += 1
    assert torch.allclose(counts / 6000, torch.tensor([0.5, 0.3, 0.2]), atol=0.03)
    counts.zero_()
    for _ in range(4000):  # top_p 0.6 keeps the two tokens whose mass first reaches 0.6: 5:3
        counts[sample(logits, SamplingParams(temperature=1.0, top_p=0.6), None, g)] += 1
    assert counts[2] == 0 and abs(counts[0] / counts[:2].sum() - 0.625) < 0.03


# --- continuous batching pieces, without a model ---------------------------------------------------------

def seq_of(n_prompt, seq_id=None):
    from neuron_workers.sequence import Sequence
    from neuron_workers.stops import StopStrings

    s = Sequence(list(range(n_prompt)), SamplingParams(max_new_tokens=4), frozenset(), None, None, StopStrings([]))
    return s


def test_scheduler_fifo_slots_budget_and_reuse():
    from neuron_workers.scheduler import Scheduler
    from neuron_workers.sequence import Status

    sch = Scheduler(max_batch=2, prefill_tokens_per_step=10)
    a, b, c, d = seq_of(8), seq_of(8), seq_of(3), seq_of(30)
    for s in (a, b, c, d):
        sch.add(s)
    assert sch.admit() == [a]  # b would pass the 10-token budget: next step
    assert sch.admit() == [b] and (a.slot, b.slot) == (0, 1)
    assert sch.admit() == []  # no free slot: c waits
    sch.finish(a)
    assert a.status is Status.FINISHED and sch.free_slots == [0]
    assert sch.admit() == [c] and c.slot == 0  # the freed slot is reused
    sch.finish(b)
    sch.finish(c)
    assert sch.admit() == [d]  # a prompt over the budget still gets in alone: never starved
    assert sch.cancel(d.seq_id) is d and d.finish_reason == "abort" and sch.free_slots == [0, 1]
    assert sch.cancel(12345) is None and not sch.has_work


def test_cancel_waiting_sequence_never_touches_a_slot():
    from neuron_workers.scheduler import Scheduler

    sch = Scheduler(max_batch=1, prefill_tokens_per_step=100)
    a, b = seq_of(4), seq_of(4)
    sch.add(a)
    sch.add(b)
    sch.admit()
    assert sch.cancel(b.seq_id) is b and b.slot is None and list(sch.running.values()) == [a]


def test_sample_rows_is_per_row_and_matches_single_row_sampling():
    """Mixed greedy and sampled rows in one call: each row's token equals sampling that row alone with a
    generator in the same state, whatever else shares the call."""
    from neuron_workers.sampling import make_generator, sample_rows

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 262_144, generator=g).to(torch.bfloat16)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=64, top_p=0.95, seed=1),
              SamplingParams(temperature=0.7, top_k=64, top_p=0.5, seed=2), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.3, top_k=8, seed=4), SamplingParams(temperature=0.9, seed=5)]
    for trial in range(3):
        gens = [None if p.greedy else make_generator(p.seed + trial) for p in params]
        together = sample_rows(logits, [(r, p, g) for r, (p, g) in enumerate(zip(params, gens))], 30.0)
        alone = []
        for r, p in enumerate(params):
            g1 = None if p.greedy else make_generator(p.seed + trial)
            alone.append(sample_rows(logits, [(r, p, g1)], 30.0)[0])
        assert together == alone
    assert together[0] == int(logits[0].float().argmax()) and together[3] == int(logits[3].float().argmax())


@pytest.mark.parametrize("vocab", [262_144, 1000])  # chunked, and the plain-torch path
def test_chunked_argmax_and_topk_equal_torch(vocab):
    from neuron_workers.sampling import Chunked

    z = torch.randn(5, vocab, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    z[2, [5, 900]] = 50.0  # a tie: the first index wins
    c, idx = Chunked(z), torch.tensor([4, 2, 0])
    assert torch.equal(c.argmax(idx), z.float()[idx].argmax(dim=1))
    vals, ids = c.topk(idx, 64)
    assert torch.equal(vals, z.float()[idx].topk(64, dim=1).values) and torch.equal(z.float()[idx].gather(1, ids), vals)


def test_stop_string_ends_the_sequence_and_frees_its_slot():
    """A stop string is the sequence's own business: the engine ends it (finish 'stop') the step it
    appears, without the text of the stop string."""
    from neuron_workers.engine import Engine

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(ord("a") + i % 26) for i in ids)

    class Model(FakeModel):
        tokenizer = Tok()

    backend = FakeBackend([7, 8, 9, 10, 11, 12])  # tokens h i j k l m
    eng = Engine(Model, backend)
    events = list(eng.generate([5, 6, 7], SamplingParams(max_new_tokens=10), stop=["jk"]))
    assert "".join(e.text for e in events) == "hi" and events[-1].finish_reason == "stop"
    assert len(events) == 4 and eng.scheduler.free_slots == [0] and not eng.has_work
