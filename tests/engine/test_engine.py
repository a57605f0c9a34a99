"""The engine loop, scheduler, stops and detokenizer, against a scripted fake backend (no model)."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.engine.detokenizer import IncrementalDetokenizer
from neuron_workers.engine.engine import Engine
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import ContextLengthError, UserError
from neuron_workers.model.dims import SLIDING

VOCAB = 64


class FakeBackend:
    """Logits that favour `script[i]` at step i; records the positions it was asked to decode."""

    def __init__(self, script, max_context=32, buckets=(8, 32)):
        self.script, self.max_context, self.buckets, self.max_batch = list(script), max_context, buckets, 1
        self.calls, self.positions = [], []

    def spec(self, phase, bucket=1):
        from neuron_workers.model.spec import make_spec

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
    events = list(Engine(FakeModel, backend).generate([5, 6, 7], SamplingParams(max_tokens=n, **kw)))
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


def test_prompt_over_context_is_a_clear_error():
    backend = FakeBackend([9])
    eng = Engine(FakeModel, backend)
    with pytest.raises(ContextLengthError, match="context is 32"):
        list(eng.generate(list(range(2, 30)), SamplingParams(max_tokens=8)))
    with pytest.raises(UserError, match="token ids"):
        list(eng.generate([2, 999], SamplingParams(max_tokens=2)))
    assert backend.calls == []


def test_incremental_detokenizer_equals_full_decode(tiny_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["gemma4-e2b-tiny"]))
    ids = tok("Hello, wörld! ✓ The capital of France is Paris.", add_special_tokens=False)["input_ids"]
    d = IncrementalDetokenizer(tok)
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) + d.flush() == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces)


def test_unused_tokens_never_become_text_even_with_special_tokens_kept(tiny_dirs):
    from transformers import AutoTokenizer

    from neuron_workers.engine.detokenizer import unused_ids

    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["gemma4-e2b-tiny"]))
    drop = unused_ids(tok)
    u58, channel = tok.convert_tokens_to_ids("<unused58>"), tok.convert_tokens_to_ids("<|channel>")
    assert u58 in drop and channel not in drop
    ids = [u58, *tok("Hello", add_special_tokens=False)["input_ids"], channel, u58]
    d = IncrementalDetokenizer(tok, skip_special_tokens=False, drop=drop)
    text = "".join(d.push(i) for i in ids) + d.flush()
    assert text == "Hello<|channel>" and tok.decode(ids, skip_special_tokens=False).count("<unused58>") == 2


def seq_of(n_prompt, seq_id=None):
    from neuron_workers.engine.sequence import Sequence
    from neuron_workers.engine.stops import StopStrings

    s = Sequence(list(range(n_prompt)), SamplingParams(max_tokens=4), frozenset(), None, None, StopStrings([]))
    return s


def test_scheduler_fifo_slots_budget_and_reuse():
    from neuron_workers.engine.scheduler import Scheduler
    from neuron_workers.engine.sequence import Status

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
    from neuron_workers.engine.scheduler import Scheduler

    sch = Scheduler(max_batch=1, prefill_tokens_per_step=100)
    a, b = seq_of(4), seq_of(4)
    sch.add(a)
    sch.add(b)
    sch.admit()
    assert sch.cancel(b.seq_id) is b and b.slot is None and list(sch.running.values()) == [a]


def test_stop_string_ends_the_sequence_and_frees_its_slot():
    """A stop string is the sequence's own business: the engine ends it (finish 'stop') the step it
    appears, without the text of the stop string."""
    from neuron_workers.engine.engine import Engine

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(ord("a") + i % 26) for i in ids)

    class Model(FakeModel):
        tokenizer = Tok()

    backend = FakeBackend([7, 8, 9, 10, 11, 12])  # tokens h i j k l m
    eng = Engine(Model, backend)
    events = list(eng.generate([5, 6, 7], SamplingParams(max_tokens=10), stop=["jk"]))
    assert "".join(e.text for e in events) == "hi" and events[-1].finish_reason == "stop"
    assert len(events) == 4 and eng.scheduler.free_slots == [0] and not eng.has_work
