"""The module the Neuron build traces holds every tensor as a parameter or a buffer (at tp=1 and tp=2): a
plain tensor attribute does not move with the module to the device and reaches the trace as unnamed data
(VocabParallelEmbedding's embed scale was one); and the sharded embedding scales exactly as HF's."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.model.graph_model import graph_model
from neuron_workers.model.loader import load_model
from neuron_workers.parallel.layers import VocabParallelEmbedding, apply_tp
from neuron_workers.parallel.shard_plan import plan_for


class OneRank:
    """Stand-in collectives: enough to build and run one rank's modules."""

    def all_reduce(self, x):
        return x

    def all_gather(self, x, dim):
        return torch.cat([x, x], dim=dim)


@pytest.mark.parametrize("tp", [1, 2])
def test_no_plain_tensor_attributes_in_the_traced_module(tiny_dirs, tp):
    m = load_model(tiny_dirs["gemma4-e4b-tiny"], torch.bfloat16)
    plan = plan_for(m.info.text_config, tp)
    if tp > 1:
        apply_tp(m.hf_lm, plan, 0, OneRank())
    module = graph_model(m.hf_lm, m.dims, 32, 2, torch.bfloat16, plan.kv_heads if tp > 1 else None)
    plain = [f"{name}.{k}" for name, sub in module.named_modules() for k, v in vars(sub).items()
             if isinstance(v, torch.Tensor)]
    assert plain == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_parallel_embedding_scales_as_hf(tiny_dirs, dtype):
    emb = load_model(tiny_dirs["gemma4-e2b-tiny"], dtype).hf_lm.model.embed_tokens
    scale = 1536 ** 0.5  # E2B's hidden size: not exact in bf16, so the rounding order shows
    emb.embed_scale = torch.tensor(scale)
    ids = torch.arange(0, 512, 7)[None]
    ours = VocabParallelEmbedding(emb.weight.data, 0, scale, OneRank())
    assert isinstance(ours.embed_scale, float)
    assert torch.equal(ours(ids), emb(ids))
