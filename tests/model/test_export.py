"""Static shapes: prefill and decode pass strict torch.export, and the exported programs give the eager
tokens over many sliding windows. The naive alternative (HF StaticCache traced as-is) goes wrong after a
few steps, which is the failure these graphs are built to avoid."""

from __future__ import annotations

import warnings

import pytest
import torch

from neuron_workers.backends.cpu import CpuBackend, export_graph
from neuron_workers.engine.engine import Engine
from neuron_workers.engine.params import SamplingParams
from neuron_workers.model.graphs import build_graph
from neuron_workers.model.loader import load_model
from neuron_workers.model.spec import DECODE, PREFILL

from conftest import hf_greedy, hf_reference

pytestmark = pytest.mark.slow  # loads models or starts a Ray cluster


WINDOW = 8


def engine(model, exported: bool) -> Engine:
    return Engine(model, CpuBackend(model.hf_lm, model.dims, 128, (32, 128), mode="export" if exported else "eager"))


def tokens(eng, ids, n=96):
    return [e.token_id for e in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]


@pytest.mark.parametrize("name", ["gemma4-e2b-tiny", "gemma4-12b-tiny"])
def test_exported_equals_eager_over_many_windows(name, tiny_dirs):
    model = load_model(tiny_dirs[name])
    ids = list(range(30, 50))  # 20 tokens: prefill already past the window
    eager = tokens(engine(model, False), ids)
    exported_engine = engine(model, True)
    assert tokens(exported_engine, ids) == eager  # 96 decode steps = 12 windows of 8
    assert {"prefill_32", "decode"} <= set(exported_engine.backend._graphs)


def test_exported_graphs_are_functional(tiny_dirs):
    """KV buffers are plain inputs and outputs: no lifted buffers, nothing mutated in place."""
    model = load_model(tiny_dirs["gemma4-e4b-tiny"])
    for phase, bucket in ((PREFILL, 16), (DECODE, 1)):
        spec = CpuBackend(model.hf_lm, model.dims, 64, (16,)).spec(phase, bucket)
        ep = export_graph(build_graph(model.hf_lm, model.dims, spec), spec)
        sig = ep.graph_signature
        assert sig.buffers_to_mutate == {} and sig.user_inputs_to_mutate == {}
        assert len(sig.user_inputs) == len(spec.inputs)
        assert len(sig.user_outputs) == 1 + spec.num_kv


class NaiveStaticCacheStep(torch.nn.Module):
    """The tempting shortcut: HF forward with a StaticCache held as an attribute, traced as-is."""

    def __init__(self, hf, cache):
        super().__init__()
        self.hf, self.cache, self.last = hf, cache, None

    def forward(self, input_ids, position_ids):
        self.last = self.hf(input_ids=input_ids, position_ids=position_ids, past_key_values=self.cache,
                            use_cache=True).logits[:, -1]
        return self.last


@torch.no_grad()
def naive_traced_tokens(hf, ids: list[int], n: int) -> list[int]:
    from transformers import StaticCache

    cache = StaticCache(config=hf.config.get_text_config(), max_cache_len=64)
    out = hf(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True,
             position_ids=torch.arange(len(ids))[None])
    got = [int(out.logits[0, -1].argmax())]
    step = NaiveStaticCacheStep(hf, cache)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(step, (torch.tensor([[got[0]]]), torch.tensor([[len(ids)]])), check_trace=False)
    got.append(int(step.last[0].argmax()))  # the trace itself ran the first decode step
    for pos in range(len(ids) + 1, len(ids) + n - 1):
        got.append(int(traced(torch.tensor([[got[-1]]]), torch.tensor([[pos]]))[0].argmax()))
    return got


def test_naive_static_cache_trace_goes_wrong_ours_does_not(tiny_dirs):
    d = tiny_dirs["gemma4-e4b-tiny"]
    ids, n = list(range(40, 60)), 24
    hf = hf_reference(d)
    expected = hf_greedy(hf, ids, n)
    naive = naive_traced_tokens(hf, ids, n)
    first_bad = next((i for i, (a, b) in enumerate(zip(expected, naive)) if a != b), None)
    assert first_bad is not None and first_bad >= 2, "naive trace: right for the first steps, then silently wrong"
    model = load_model(d)
    assert tokens(engine(model, False), ids, n) == expected
