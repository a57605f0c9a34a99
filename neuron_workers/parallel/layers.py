"""Tensor-parallel layers applied to a loaded HF Gemma-4 text model, following `shard_plan.ShardPlan`.

`apply_tp` slices every weight for one rank and swaps in three small modules at the plan's collective
points; the decoder layers themselves stay transformers' own. Collectives are injected (`parallel.collectives`):
torch.distributed/gloo on CPU, NxD's mappings on Neuron, so both backends share these points:
  - RowParallelLinear (o_proj, down_proj): all-reduce of the partial outputs
  - VocabParallelEmbedding: masked lookup in the rank's vocab rows, all-reduce
  - VocabParallelHead (tied to the same shard): partial logits, all-gather along the vocabulary (the top-K
    `decode` graph gathers only each rank's top-K candidates instead)
"""

from __future__ import annotations

import torch
from torch import nn

from neuron_workers.parallel.collectives import Collectives
from neuron_workers.parallel.shard_plan import COL, REP, ShardPlan


class RowParallelLinear(nn.Module):
    """Partial products all-reduced in fp32 and cast back, as NxD's RowParallelLinear (`reduce_dtype`):
    summing bf16 partials would round twice per layer."""

    def __init__(self, weight: torch.Tensor, coll: Collectives):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.coll = coll

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        wide = torch.promote_types(partial.dtype, torch.float32)  # bf16 -> fp32; fp32 / fp64 unchanged
        return self.coll.all_reduce(partial.to(wide)).to(partial.dtype)


class VocabParallelEmbedding(nn.Module):
    """The rank's first vocab row is a per-rank tensor, not a Python int: an SPMD-traced program (NxD)
    is one graph for every rank, so the offset must arrive with the rank's weights (as NxD's SPMDRank)."""

    def __init__(self, weight: torch.Tensor, start: int, scale: float, coll: Collectives):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.vocab_start = nn.Parameter(torch.tensor([start], dtype=torch.int32), requires_grad=False)
        self.coll = coll
        # A Python float (rounded as HF's `embed_scale.to(weight.dtype)`), not a plain tensor attribute: a
        # tensor that is neither parameter nor buffer does not move with the module and is unnamed device data.
        self.embed_scale = float(torch.tensor(scale).to(weight.dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start.to(ids.dtype)
        inside = (local >= 0) & (local < self.weight.shape[0])
        rows = nn.functional.embedding(torch.where(inside, local, 0), self.weight)
        rows = torch.where(inside[..., None], rows * self.embed_scale, 0.0)
        return self.coll.all_reduce(rows)


class VocabParallelHead(nn.Module):
    def __init__(self, embedding: VocabParallelEmbedding, coll: Collectives):
        super().__init__()
        self.embedding, self.coll = embedding, coll

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.gather(self.local_logits(h))

    def local_logits(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the logits [..., vocab / tp] (the top-K `decode` graph gathers only its
        candidates: `model.tiled_topk.sharded_topk`)."""
        return nn.functional.linear(h, self.embedding.weight)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` concatenated along the last dim, in rank order."""
        return self.coll.all_gather(x, dim=-1)


def shard_tensor(plan: ShardPlan, key: str, t: torch.Tensor, rank: int) -> torch.Tensor:
    """This rank's slice of the full tensor `t` stored under HF module key `key`."""
    kind, dim = plan.rule(key)
    if kind == REP:
        return t
    return t.chunk(plan.tp, dim=dim)[rank].clone()


def _linear(plan, key, linear: nn.Linear, rank) -> nn.Linear:
    w = shard_tensor(plan, key, linear.weight.data, rank)
    out = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
    out.weight = nn.Parameter(w, requires_grad=False)
    return out


@torch.no_grad()
def apply_tp(hf_lm: nn.Module, plan: ShardPlan, rank: int, coll: Collectives) -> nn.Module:
    """Shard `hf_lm` in place for `rank`; returns it."""
    m = hf_lm.model
    shard_layers(m, plan, rank, coll)
    emb = m.embed_tokens
    m.embed_tokens = VocabParallelEmbedding(shard_tensor(plan, "model.embed_tokens.weight", emb.weight.data, rank),
                                            rank * plan.vocab_per_rank, emb.scalar_embed_scale, coll)
    hf_lm.lm_head = VocabParallelHead(m.embed_tokens, coll)
    return hf_lm


@torch.no_grad()
def apply_tp_assistant(assistant: nn.Module, plan: ShardPlan, rank: int, coll: Collectives) -> nn.Module:
    """Shard an MTP drafter (`model.assistant.Assistant`) in place: its layers as the target's (query heads
    split as the K/V they read from the target's store layers, `plan_for_assistant`); its embedding, head
    and projections stay whole (the centroid-masked head reads whole rows of it; small beside the target)."""
    shard_layers(assistant.model, plan, rank, coll)
    return assistant


def shard_layers(m: nn.Module, plan: ShardPlan, rank: int, coll: Collectives) -> None:
    for i, layer in enumerate(m.layers):
        attn, mlp, pre = layer.self_attn, layer.mlp, f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj"):
            lin = getattr(attn, name, None)
            if isinstance(lin, nn.Linear) and plan.rule(pre + f"self_attn.{name}.weight")[0] == COL:
                setattr(attn, name, _linear(plan, pre + f"self_attn.{name}.weight", lin, rank))
        attn.o_proj = RowParallelLinear(shard_tensor(plan, pre + "self_attn.o_proj.weight", attn.o_proj.weight.data,
                                                     rank), coll)
        attn.num_key_value_groups = plan.layers[i].groups
        mlp.gate_proj = _linear(plan, pre + "mlp.gate_proj.weight", mlp.gate_proj, rank)
        mlp.up_proj = _linear(plan, pre + "mlp.up_proj.weight", mlp.up_proj, rank)
        mlp.down_proj = RowParallelLinear(shard_tensor(plan, pre + "mlp.down_proj.weight", mlp.down_proj.weight.data,
                                                       rank), coll)

