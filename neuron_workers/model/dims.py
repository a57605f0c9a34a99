"""ModelDims: the shape facts of one Gemma-4 text decoder, read once from the HF text config.

Everything that sizes a graph input or a KV buffer comes from here, so the E2B / E4B / 12B
differences live in data (layer_types, per-layer head counts, KV sharing), never in `if size == ...`.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL = "full_attention"
SLIDING = "sliding_attention"
DECODE_CANDIDATES = 256  # K of the `decode` graph (NxD Inference's global_topk): Gemma-4's top_k 64 + margin
# Sliding rings hold the window plus this many positions (at most the window again): a position written and
# later abandoned (a rejected draft, the tail of a kept prefix that a new prompt leaves) overwrites only ring
# entries at least `slack` behind the newest, which no query from the abandoned point on needs. It bounds an
# abandoning extend (speculative verify) to T <= slack + 1 and a reused prefix to one that ends within slack
# of the kept history. Chunked prefill needs none (its pads write back the old values, and its queries read
# the ring as it was before the chunk). E2B / E4B (window 512): ring 576; 12B (1024): 1088.
RING_SLACK = 64


@dataclass(frozen=True, slots=True)
class ModelDims:
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    layer_types: tuple[str, ...]
    kv_heads: tuple[int, ...]  # per layer
    head_dims: tuple[int, ...]  # per layer
    kv_source: tuple[int, ...]  # per layer: the layer whose K/V it attends over (itself unless "reuse")
    sliding_window: int
    ple_dim: int  # hidden_size_per_layer_input, 0 when the model has no per-layer embeddings
    ple_vocab: int
    final_logit_softcapping: float | None
    max_position_embeddings: int
    # the soft-token ids whose embeddings the prefill / extend graphs take from `mm_embeds` (image, audio); empty:
    # the graphs take no media (text-only checkpoints, and the xla / neuron backends: `factory.with_media`)
    media_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, cfg) -> "ModelDims":
        """Read a Gemma4TextConfig / Gemma4UnifiedTextConfig (per-layer values via `per_layer_config`)."""
        n = cfg.num_hidden_layers
        modes = list(getattr(cfg, "kv_sharing_modes", None) or [None] * n)
        types = tuple(cfg.layer_types)
        source = []
        for i in range(n):
            if modes[i] == "reuse":
                stores = [j for j in range(i) if modes[j] == "store" and types[j] == types[i]]
                if not stores:
                    raise ValueError(f"layer {i} reuses KV but no earlier {types[i]} layer stores it")
                source.append(stores[-1])
            else:
                source.append(i)
        ple = int(getattr(cfg, "hidden_size_per_layer_input", 0) or 0)
        if cfg.model_type == "gemma4_unified_text":
            ple = 0  # the unified (12B) text model has no PLE code path, whatever the json says
        return cls(
            num_layers=n,
            hidden_size=cfg.hidden_size,
            vocab_size=cfg.vocab_size,
            num_attention_heads=cfg.num_attention_heads,
            layer_types=types,
            kv_heads=tuple(cfg.per_layer_config[i].num_key_value_heads for i in range(n)),
            head_dims=tuple(cfg.per_layer_config[i].head_dim for i in range(n)),
            kv_source=tuple(source),
            sliding_window=cfg.sliding_window,
            ple_dim=ple,
            ple_vocab=int(getattr(cfg, "vocab_size_per_layer_input", 0) or 0) if ple else 0,
            final_logit_softcapping=cfg.final_logit_softcapping,
            max_position_embeddings=cfg.max_position_embeddings,
        )

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """Layers that own a KV buffer, in graph I/O order."""
        return tuple(i for i in range(self.num_layers) if self.kv_source[i] == i)

    @property
    def first_shared_layer(self) -> int:
        """Index of the first layer that reuses another layer's KV (num_layers when none does)."""
        return next((i for i in range(self.num_layers) if self.kv_source[i] != i), self.num_layers)

    def ring_size(self, max_context: int) -> int:
        """Slots of a sliding layer's ring: the window plus `ring_slack` (see RING_SLACK)."""
        return min(self.sliding_window + self.ring_slack, max_context)

    @property
    def ring_slack(self) -> int:
        return min(RING_SLACK, self.sliding_window)

    def window_bytes(self, dtype_bytes: int, tp: int = 1) -> int:
        """Bytes of one kept sliding window (`model/kept_windows.py`: K and V of every sliding KV layer over W
        positions) on one core; a TP rank holds its share of the KV heads."""
        return sum(2 * -(-self.kv_heads[i] // tp) * self.sliding_window * self.head_dims[i] * dtype_bytes
                   for i in self.kv_layers if self.layer_types[i] != FULL)

    def kv_shape(self, layer: int, batch: int, max_context: int, kv_heads: int | None = None) -> tuple[int, ...]:
        """[B, kv_heads, slots, head_dim]: full layers hold max_context slots, sliding layers a ring."""
        slots = max_context if self.layer_types[layer] == FULL else self.ring_size(max_context)
        heads = self.kv_heads[layer] if kv_heads is None else kv_heads
        return (batch, heads, slots, self.head_dims[layer])


def decode_candidates(dims) -> int:
    """K of the `decode` graph's top-K candidates for this model (the vocabulary, if that is smaller)."""
    return min(DECODE_CANDIDATES, dims.vocab_size)
