"""The tensor-parallel shard plan: one pure function from (text config, tp) to per-rank shapes and
weight slices. No tensors are touched here; `parallel.layers.apply_tp` and the Neuron backend follow it.

Rules (Megatron-style, with Gemma-4's mixed heads):
- q_proj: column split by query heads. o_proj: row split, all-reduce after.
- k_proj / v_proj: column split by KV heads when tp divides them; otherwise *replicated* (every rank
  holds all KV heads: E2B's single KV head, 12B's full layers with 1 KV head). Per rank the group count
  is (query heads per rank) / (KV heads per rank): it stays 4 for E4B (4 q / 1 kv per rank) and shrinks
  from 16 to 8 for 12B full layers, and local query head i reads local KV head i // groups, the same
  query -> KV mapping as unsharded. Replication is only exact when there is a single KV head, so
  other indivisible KV counts are refused.
- KV-shared layers own no KV and read their storing layer's rank-local K/V: the plan checks that the
  reader's KV layout equals the storing layer's.
- MLP gate/up: column split (the double-wide MLP too); down: row split, all-reduce after.
- Norms, layer scalars, the per-layer-input gate/projection/norms and the model-level PLE projection:
  replicated (small; the PLE table itself stays on the host).
- Embedding and tied LM head: split by vocabulary rows, one shard serving both (Megatron's
  VocabParallelEmbedding + parallel head): the lookup is masked to the rank's rows and all-reduced,
  the head's partial logits are all-gathered. Each rank holds 1/tp of the largest matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_workers.config import check_tp
from neuron_workers.errors import UserError
from neuron_workers.model.dims import FULL, SLIDING, ModelDims

COL, ROW, REP, VOCAB = "col", "row", "rep", "vocab"


@dataclass(frozen=True, slots=True)
class LayerShard:
    q_heads: int  # per rank
    kv_heads: int  # per rank (the KV buffer's head count on each rank)
    kv_replicated: bool
    groups: int  # num_key_value_groups on each rank
    head_dim: int
    owns_kv: bool
    intermediate: int  # MLP width per rank


@dataclass(frozen=True, slots=True)
class ShardPlan:
    tp: int
    vocab: int
    vocab_per_rank: int
    layers: tuple[LayerShard, ...]
    layer_types: tuple[str, ...]

    @property
    def kv_heads(self) -> tuple[int, ...]:
        return tuple(s.kv_heads for s in self.layers)

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> dict[str, int]:
        """K+V bytes one rank stores per token, for full layers and (up to the window) sliding layers."""
        out = {FULL: 0, SLIDING: 0}
        for t, s in zip(self.layer_types, self.layers):
            if s.owns_kv:
                out[t] += 2 * s.kv_heads * s.head_dim * bytes_per_elem
        return out

    def rule(self, key: str) -> tuple[str, int]:
        """How the HF weight `key` (module key, e.g. model.layers.3.mlp.down_proj.weight) is split."""
        parts = key.split(".")
        if key in ("model.embed_tokens.weight", "lm_head.weight"):
            return VOCAB, 0
        if parts[1] != "layers" or not key.endswith("_proj.weight"):
            return REP, 0
        layer, name = int(parts[2]), parts[-2]
        if name in ("q_proj", "gate_proj", "up_proj"):
            return COL, 0
        if name in ("o_proj", "down_proj"):
            return ROW, 1
        if name in ("k_proj", "v_proj"):
            return (REP, 0) if self.layers[layer].kv_replicated else (COL, 0)
        return REP, 0  # per_layer_input_gate / per_layer_projection

    def weight_bytes_per_rank(self, shapes: dict[str, tuple[int, ...]], bytes_per_elem: int = 2) -> int:
        """Bytes one rank holds for the weights `shapes` (HF module keys; the tied lm_head counted once)."""
        total = 0
        for key, shape in shapes.items():
            if key == "lm_head.weight":
                continue
            n = 1
            for d in self.shard_shape(key, shape):
                n *= d
            total += n * bytes_per_elem
        return total

    def shard_shape(self, key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        kind, dim = self.rule(key)
        if kind == REP:
            return tuple(shape)
        out = list(shape)
        out[dim] //= self.tp
        return tuple(out)


def make_plan(dims: ModelDims, intermediate_sizes: tuple[int, ...], tp: int) -> ShardPlan:
    """The plan for `dims` at degree `tp`; `intermediate_sizes` is the MLP width of each layer."""
    check_tp(tp)
    hq = dims.num_attention_heads
    if hq % tp:
        raise UserError(f"tp={tp} does not divide the {hq} query heads of this model", param="tp")
    if dims.vocab_size % tp:
        raise UserError(f"tp={tp} does not divide the vocabulary ({dims.vocab_size})", param="tp")
    layers = tuple(_layer(dims, i, intermediate_sizes[i], tp) for i in range(dims.num_layers))
    for i, src in enumerate(dims.kv_source):
        if (layers[i].kv_heads, layers[i].kv_replicated) != (layers[src].kv_heads, layers[src].kv_replicated):
            raise UserError(f"layer {i} reads layer {src}'s KV but would shard it differently")
    return ShardPlan(tp, dims.vocab_size, dims.vocab_size // tp, layers, dims.layer_types)


def _layer(dims: ModelDims, i: int, intermediate: int, tp: int) -> LayerShard:
    hq, hkv = dims.num_attention_heads // tp, dims.kv_heads[i]
    if hkv % tp == 0:
        kv, replicated = hkv // tp, False
    elif hkv == 1:
        kv, replicated = 1, True
    else:
        raise UserError(f"layer {i} has {hkv} KV heads: tp={tp} neither divides nor can replicate them", param="tp")
    if intermediate % tp:
        raise UserError(f"tp={tp} does not divide layer {i}'s MLP width {intermediate}", param="tp")
    return LayerShard(hq, kv, replicated, hq // kv, dims.head_dims[i], dims.kv_source[i] == i, intermediate // tp)


def intermediate_sizes(text_config) -> tuple[int, ...]:
    """Per-layer MLP width: KV-shared layers are double-wide when `use_double_wide_mlp` (E2B)."""
    modes = getattr(text_config, "kv_sharing_modes", None) or [None] * text_config.num_hidden_layers
    wide = bool(getattr(text_config, "use_double_wide_mlp", False))
    return tuple(text_config.intermediate_size * (2 if wide and m == "reuse" else 1) for m in modes)


def plan_for(text_config, tp: int) -> ShardPlan:
    return make_plan(ModelDims.from_hf(text_config), intermediate_sizes(text_config), tp)


def plan_for_assistant(text_config, tp: int) -> ShardPlan:
    """An MTP drafter's plan: each layer split as if it owned K/V with the heads of the target layer it reads
    (`assistant.check_pairing` makes those equal), so its rank-local query heads meet that layer's
    rank-local K/V with the same query -> KV mapping."""
    from neuron_workers.model.assistant import own_kv

    cfg = own_kv(text_config)
    return make_plan(ModelDims.from_hf(cfg), intermediate_sizes(cfg), tp)
