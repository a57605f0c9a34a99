"""The static-shape graph modules that compile/ traces: one prefill graph per bucket, two decode graphs and
the extend graphs (R rows x T new tokens over the slots' cache: `extend_kv.ExtendKV`).

They run transformers' own Gemma-4 decoder layers (no math is rewritten), and own only the plumbing
around them: embedding, the PLE projection, RoPE tables, the layer loop, the final norm and the tied LM
head. Their only state is explicit tensors, declared (inputs and outputs) in `spec.GraphSpec`:

  prefill: input_ids, position_ids, [per_layer_inputs], mask_full, mask_sliding, last_idx, ring_idx, slot, *kv
  decode:  input_ids, position_ids, [per_layer_inputs], mask_full, mask_sliding, *kv   (decode, decode_logits)
  extend:  input_ids, position_ids, [per_layer_inputs], mask_full, mask_sliding, last_idx, slots, *kv
  (prefill and extend of a media model: `mm_embeds` after the other host inputs, before *kv)
  mixed:   the extend inputs over one token axis of B decode tokens + T chunk tokens (`mixed_kv.MixedKV`)
  outputs: prefill and decode_logits: logits [rows, vocab] at the last real position, without the soft-cap;
           decode: each row's K largest raw logits [rows, K] and their ids [rows, K]; the mixed graph: the
           same for B + 1 rows (the B decode tokens, then the chunk's last real position); the `_h` variants
           of the top-K graphs also the normed hidden state of those rows [rows, H]; then *kv updated

Every KV update is a function of the old buffer (the rule the Neuron runtime needs to keep KV as device
state, and what keeps batched rows independent): prefill writes its prompt into row `slot` with
`index_copy` into the old buffer, decode writes each row's new K/V at that row's position with
`torch.scatter` into the old buffer (one position per row). Everything not written stays bit-identical.

The HF layers talk to the KV buffers through a duck-typed cache whose `update` is functional (no
in-place writes, no counters): positions come from `position_ids`, so nothing freezes when traced.
KV-shared layers compute no K/V and read the storing layer's via HF's `shared_kv_states` dict inside
the same graph, so the dependency stays live in the traced program.
"""

from __future__ import annotations

import torch
from torch import nn

from neuron_workers.model.dims import FULL, SLIDING, ModelDims
from neuron_workers.model.extend_kv import ExtendKV
from neuron_workers.model.mixed_kv import MixedKV
from neuron_workers.model.spec import EXTEND, MIXED, PREFILL, GraphSpec
from neuron_workers.model.tiled_topk import sharded_topk, tiled_topk, torch_topk_op


class PrefillKV:
    """Prefill: attention sees the fresh K/V. Row `slot` of each buffer is replaced: full buffers get the
    prompt's K/V at positions [0, P) and zeros after, rings get the `ring_idx` positions."""

    def __init__(self, dims: ModelDims, kv: list[torch.Tensor], ring_idx: torch.Tensor, slot: torch.Tensor):
        self.dims, self.kv, self.ring_idx = dims, kv, ring_idx
        self.row = slot.reshape(1).to(torch.int64)
        self.index = {layer: 2 * j for j, layer in enumerate(dims.kv_layers)}

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        j = self.index[layer_idx]
        self.kv[j], self.kv[j + 1] = (self._store(layer_idx, x, self.kv[j + i]) for i, x in enumerate((k, v)))
        return k, v

    def _store(self, layer: int, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        b, h, p, d = x.shape
        if self.dims.layer_types[layer] == FULL:
            pad = buf.shape[2] - p
            row = x if pad == 0 else torch.cat([x, x.new_zeros(b, h, pad, d)], dim=2)
        else:
            idx = self.ring_idx[:, None, :, None].expand(b, h, self.ring_idx.shape[1], d)
            row = torch.gather(x, 2, idx)
        return torch.index_copy(buf, 0, self.row, row.to(buf.dtype))  # read-modify-write of the old buffer


class DecodeKV:
    """Decode, every row at its own position: write the new K/V at `pos` (full) or `pos % ring` (sliding)
    of that row with `torch.scatter` into the old buffer (one position per row is written, as NxD's and NxD
    Inference's KV updates: no select over the whole [B, H, ctx, D] buffer); attend over the buffer."""

    def __init__(self, dims: ModelDims, kv: list[torch.Tensor], position_ids: torch.Tensor):
        self.dims, self.kv = dims, kv
        self.index = {layer: 2 * j for j, layer in enumerate(dims.kv_layers)}
        self.pos = position_ids[:, :1]  # [B, 1], the ids' dtype (int32 on the Neuron graphs: no s64 index)
        self.scatter_index: dict[tuple[int, ...], torch.Tensor] = {}  # buffer shape -> index [B, H, 1, D]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        j = self.index[layer_idx]
        idx = self._index(self.kv[j].shape)
        self.kv[j] = torch.scatter(self.kv[j], 2, idx, k.to(self.kv[j].dtype))  # reads the old buffer
        self.kv[j + 1] = torch.scatter(self.kv[j + 1], 2, idx, v.to(self.kv[j + 1].dtype))
        return self.kv[j], self.kv[j + 1]

    def _index(self, shape) -> torch.Tensor:
        key = tuple(shape)
        if key not in self.scatter_index:
            b, h, n, d = key
            self.scatter_index[key] = (self.pos % n).reshape(b, 1, 1, 1).expand(b, h, 1, d)
        return self.scatter_index[key]


def _take(x: torch.Tensor, idx: torch.Tensor, dim: int, tokens: bool = False) -> torch.Tensor:
    """x[b, ..., idx[b], ...] along `dim`, keeping that dim with size 1 (static shapes); `tokens`: x has batch 1
    and idx picks its entries along `dim` (the mixed graph's B + 1 tokens)."""
    if tokens:
        return x.index_select(dim, idx)
    shape = list(x.shape)
    shape[dim] = 1
    view = [x.shape[0]] + [1] * (x.dim() - 1)
    view[dim] = 1
    return torch.gather(x, dim, idx.reshape(view).expand(shape))


class GemmaGraph(nn.Module):
    """One phase of the model as a function of the tensors named in `spec`."""

    def __init__(self, hf_lm: nn.Module, dims: ModelDims, spec: GraphSpec):
        super().__init__()
        self.model, self.lm_head = hf_lm.model, hf_lm.lm_head
        self.dims, self.spec = dims, spec
        self.names = tuple(t.name for t in spec.inputs)
        self.num_fixed = len(self.names) - spec.num_kv
        self.layer_types = sorted(set(dims.layer_types))
        self.topk_op = torch_topk_op  # (x, k, dim) -> (values, ids) per tile; the Neuron build passes the SDK's TopK

    def forward(self, *inputs: torch.Tensor):
        x = dict(zip(self.names[: self.num_fixed], inputs[: self.num_fixed]))
        kv = list(inputs[self.num_fixed:])
        if self.spec.phase == PREFILL:
            cache = PrefillKV(self.dims, kv, x["ring_idx"], x["slot"])
        elif self.spec.phase == EXTEND:
            cache = ExtendKV(self.dims, kv, x["position_ids"], x["last_idx"], x["slots"])
        elif self.spec.phase == MIXED:
            cache = MixedKV(self.dims, kv, x["position_ids"], x["last_idx"], x["slots"], self.spec.batch)
        else:
            cache = DecodeKV(self.dims, kv, x["position_ids"])
        hidden = self._decoder(x, cache)
        if self.spec.per_position:  # [R, T, H] -> every position's candidates [R, T, K] (and hidden [R, T, H])
            r, t = hidden.shape[:2]
            return (*(x.reshape(r, t, -1) for x in self._head(hidden.reshape(r * t, 1, -1))), *cache.kv)
        return (*self._head(hidden), *cache.kv)

    def _head(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tied LM head; the top-K variant keeps each row's K best raw logits (the soft-cap is
        monotone, so they are the K best after it too) and their ids, best first, with the tiled top-K
        (`tiled_topk`). A vocabulary-parallel head (tp > 1: it has `local_logits`) takes the top-K of its
        own shard and gathers only the candidates; `decode_logits` gathers the logits. A `hidden` graph also
        returns the normed hidden state (what an MTP drafter reads)."""
        normed = self.model.norm(hidden)
        k = self.spec.candidates
        local = getattr(self.lm_head, "local_logits", None)
        if k and local is not None:
            values, ids = sharded_topk(local(normed)[:, 0, :], k, self.lm_head.gather, self.dims.vocab_size,
                                       self.topk_op)
        else:
            logits = self.lm_head(normed)[:, 0, :]
            if not k:
                return (logits,)
            values, ids = tiled_topk(logits, k, self.topk_op)
        out = (values, ids.to(self.spec.outputs[1].dtype))
        return out + (normed[:, 0, :],) if self.spec.hidden else out

    def _embed(self, x: dict) -> torch.Tensor:
        """The scaled token embeddings; with `mm_embeds` (a media model's prefill / extend graphs) the media soft
        tokens take theirs from it, unscaled, as transformers' `masked_scatter` of the encoders' output."""
        ids = x["input_ids"]
        h = self.model.embed_tokens(ids)
        if "mm_embeds" not in x:
            return h
        media = torch.tensor(self.dims.media_ids, dtype=ids.dtype, device=ids.device)  # ids' dtype: no s64 op
        soft = (ids[..., None] == media).any(-1)
        return torch.where(soft[..., None], x["mm_embeds"].to(h.dtype), h)

    def _decoder(self, x: dict, cache) -> torch.Tensor:
        m, dims = self.model, self.dims
        position_ids = x["position_ids"]
        h = self._embed(x)
        ple = m.project_per_layer_inputs(h, x["per_layer_inputs"]) if dims.ple_dim else None
        rope = {t: m.rotary_emb(h, position_ids, t) for t in self.layer_types}
        masks = {FULL: x["mask_full"], SLIDING: x["mask_sliding"]}
        last = None if self.spec.per_position else x.get("last_idx")
        mixed = self.spec.phase == MIXED
        if mixed:  # the B decode tokens and the chunk's last real one: [B + 1]
            b = self.spec.batch
            last = torch.cat([torch.arange(b, dtype=last.dtype, device=last.device), b + last])
        shared: dict = {}
        for i, layer in enumerate(m.layers):
            if last is not None and i == dims.first_shared_layer:
                # KV-shared layers write no KV: in prefill only the last real token needs them.
                h, ple, rope, masks, position_ids = _select_last(last, mixed, h, ple, rope, masks, position_ids)
                last = None
            extra = {"per_layer_input": ple[:, :, i, :]} if ple is not None else {}
            h = layer(h, shared_kv_states=shared, position_embeddings=rope[dims.layer_types[i]],
                      attention_mask=masks[dims.layer_types[i]], position_ids=position_ids,
                      past_key_values=cache, **extra)
        if last is not None:
            h = _take(h, last, 1, mixed)
        return h.reshape(-1, 1, h.shape[-1]) if mixed else h  # [B + 1, 1, H]


def _select_last(last, tokens: bool, h, ple, rope, masks, position_ids):
    h = _take(h, last, 1, tokens)
    ple = _take(ple, last, 1, tokens) if ple is not None else None
    rope = {t: (_take(c, last, 1, tokens), _take(s, last, 1, tokens)) for t, (c, s) in rope.items()}
    masks = {t: _take(mk, last, 2, tokens) for t, mk in masks.items()}
    return h, ple, rope, masks, _take(position_ids, last, 1, tokens)


def build_graph(hf_lm: nn.Module, dims: ModelDims, spec: GraphSpec) -> GemmaGraph:
    return GemmaGraph(hf_lm, dims, spec).eval()
