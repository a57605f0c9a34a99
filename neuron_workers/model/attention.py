"""The attention kernel our graphs register with transformers (`attn_implementation="gemma4_static"`).

Same math as HF's `eager_attention_forward` (scores = q k^T * scaling + additive mask, fp32 softmax,
times v) but grouped-query attention is done by viewing the query heads of each KV head as extra rows,
instead of `repeat_kv` copying every K/V buffer `groups` times per layer per step. The group count
comes from the tensors each rank actually holds (query heads / KV heads), so a TP shard needs no
patched attribute to keep its query -> KV mapping (query head h reads KV head h // groups). The mixed graph's
keys come split in two (`mixed_kv.SplitKV`): the same kernel runs on each part.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from neuron_workers.model.mixed_kv import SplitKV, split_attention

NAME = "gemma4_static"


def static_gqa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    if isinstance(key, SplitKV):
        return split_attention(static_gqa_attention, module, query, key, value, attention_mask, scaling=scaling)
    b, hq, s, d = query.shape
    hkv, n = key.shape[1], key.shape[2]
    groups = hq // hkv
    q = query.reshape(b, hkv, groups * s, d)
    scores = torch.matmul(q, key.transpose(2, 3)) * (1.0 if scaling is None else scaling)
    scores = scores.view(b, hkv, groups, s, n)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, :n]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs.view(b, hkv, groups * s, n), value)
    return out.view(b, hq, s, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, static_gqa_attention)
