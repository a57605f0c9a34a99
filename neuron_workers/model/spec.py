"""GraphSpec: the declared, ordered inputs and outputs of one compiled graph (a prefill bucket or the
decode step).

The tracer (compile/), the backends and the engine all build argument tuples from `GraphSpec.inputs`,
so the order of graph inputs is written down exactly once. `GraphSpec.outputs` is
`(logits [rows, vocab], *kv)` with kv in the same order as the kv inputs (k0, v0, k1, v1, ...).

Decode comes in two graphs over the same inputs and the same KV state: `decode` (`candidates=K`)
returns each row's K largest raw logits and their token ids (`(candidate_values [rows, K],
candidate_ids [rows, K], *kv)`, best first: K x 6 bytes a row in bf16 instead of vocab x 2), and
`decode_logits` (`candidates=0`) the full logits. The engine runs `decode` unless some row of the step
needs the whole distribution (`engine.sampling.needs_logits`).

Extend (`extend_{R}x{T}`, `_logits`, `_all`): R rows of T new tokens each, attending to what their slots
hold plus causally within the chunk, writing T positions per row (chunked prefill; speculative verify with
per-position candidates, `per_position`).

Mixed (`mixed_{B}x{T}`, `_logits`, `_h`; `model.mixed_kv`): one decode token for each of the B slots and T new
tokens of one row (a chunk of chunked prefill) in one graph, one token axis of B + T: the linear layers and the MLP
read each weight once for both, attention is split (the decode tokens as in `decode`, the chunk as in `extend`),
and the head runs on the B decode rows and the chunk's last real position (B + 1 rows); `_h` (beside an MTP
drafter) also returns those rows' hidden states, as `decode_h` does.

Draft (`draft`, with an MTP drafter: `draft_graph.DraftGraph`): one draft token for every row from its token and a
hidden state, over the KV of the target's store layers, read-only; its inputs are host inputs only and its
outputs the draft ids and the drafter's next hidden state (no KV: the graph replaces none).

Media (a model whose `dims.media_ids` is set): the prefill and extend graphs take one more input, `mm_embeds`
[rows, T, H], the image / audio soft tokens' embeddings at their positions (`graphs.GemmaGraph._embed`); decode and
the mixed graph take none (a chunk with media runs through the extend graph).

Batching: the KV buffers hold `batch` rows (slots), one per running sequence. The decode graph takes one
token for every row; a prefill graph takes one prompt (batch 1, padded to its bucket) and writes it into
the row named by its `slot` input, leaving every other row as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from neuron_workers.model.dims import DECODE_CANDIDATES, FULL, SLIDING, ModelDims, decode_candidates

__all__ = ["DECODE", "DECODE_CANDIDATES", "DECODE_LOGITS", "DRAFT", "EXTEND", "MIXED", "PREFILL", "Candidates",
           "GraphSpec", "TensorSpec", "decode_candidates", "draft_spec", "kv_specs", "make_spec", "mixed_spec"]

PREFILL, DECODE, EXTEND, DRAFT, MIXED = "prefill", "decode", "extend", "draft", "mixed"
DECODE_LOGITS = "decode_logits"  # the tag of the decode variant that returns the full logits
KV_PREFIXES = ("k.", "v.")


class Candidates(NamedTuple):
    """What the `decode` graph returns for the rows of a step: raw logits, best first, and their token ids."""

    values: torch.Tensor  # [rows, K], the graph's dtype
    ids: torch.Tensor  # [rows, K], the graph's id dtype
    hidden: torch.Tensor | None = None  # [rows, H]: the last hidden state after the final norm (`hidden` graphs)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def zeros(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype)


@dataclass(frozen=True, slots=True)
class GraphSpec:
    phase: str  # prefill | decode | extend | mixed | draft
    batch: int  # KV rows (slots); decode runs all of them, prefill writes one
    seq_len: int  # the prefill bucket, 1 for decode
    max_context: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]  # logits (raw, without the soft-cap) or candidates, then the updated KV
    candidates: int = 0  # decode / extend: K > 0 returns top-K candidates, 0 the full logits
    rows: int = 0  # extend: rows R of new tokens (each written into the slot its `slots` entry names)
    per_position: bool = False  # extend: candidates of every position [R, T, K] instead of the last one's
    hidden: bool = False  # candidates come with the last hidden state after the final norm (an MTP drafter's input)
    media_ids: tuple[int, ...] = ()  # with `mm_embeds`: the soft-token ids it replaces (others are fed as pad)

    @property
    def tag(self) -> str:
        if self.phase == DRAFT:
            return DRAFT
        if self.phase == PREFILL:
            return f"{self.phase}_{self.seq_len}"
        if self.phase == EXTEND:
            head = ("_all" if self.per_position else "") if self.candidates else \
                ("_logits_all" if self.per_position else "_logits")
            return f"extend_{self.rows}x{self.seq_len}{head}{'_h' if self.hidden else ''}"
        if self.phase == MIXED:
            head = ("_h" if self.hidden else "") if self.candidates else "_logits"
            return f"mixed_{self.batch}x{self.seq_len}{head}"
        return (f"{DECODE}{'_h' if self.hidden else ''}") if self.candidates else DECODE_LOGITS

    @property
    def num_heads(self) -> int:
        """Outputs before the KV buffers: 1 (logits), 2 (candidate values and ids) or 3 (and the hidden state)."""
        return len(self.outputs) - self.num_kv

    @property
    def num_kv(self) -> int:
        return sum(1 for t in self.inputs if t.name.startswith(KV_PREFIXES))

    @property
    def kv_inputs(self) -> tuple[TensorSpec, ...]:
        return self.inputs[len(self.inputs) - self.num_kv:]

    @property
    def host_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs the host builds each call (everything but the KV buffers)."""
        return self.inputs[: len(self.inputs) - self.num_kv]

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(t.zeros() for t in self.inputs)


def kv_specs(dims: ModelDims, batch: int, max_context: int, dtype: torch.dtype,
             kv_heads: tuple[int, ...] | None = None) -> tuple[TensorSpec, ...]:
    """KV buffers of the KV-owning layers; `kv_heads` overrides the per-layer heads (a TP rank's share)."""
    out = []
    for i in dims.kv_layers:
        shape = dims.kv_shape(i, batch, max_context, None if kv_heads is None else kv_heads[i])
        out += [TensorSpec(f"k.{i}", shape, dtype), TensorSpec(f"v.{i}", shape, dtype)]
    return tuple(out)


def make_spec(dims: ModelDims, phase: str, batch: int, seq_len: int, max_context: int,
              dtype: torch.dtype = torch.float32, id_dtype: torch.dtype = torch.int64,
              kv_heads: tuple[int, ...] | None = None, candidates: int = 0, rows: int = 0,
              per_position: bool = False, hidden: bool = False) -> GraphSpec:
    """Inputs of a prefill graph (seq_len = bucket, one prompt into one of `batch` slots) or of the
    decode graph (one token for each of the `batch` rows; `candidates` K > 0: the top-K variant); the extend
    and mixed graphs' come from `extend_spec` and `mixed_spec`."""
    if phase not in (PREFILL, DECODE, EXTEND, DRAFT, MIXED):
        raise ValueError(f"unknown phase {phase!r}")
    if phase == DRAFT:
        if candidates or rows or per_position or hidden:
            raise ValueError("the draft graph has no variants")
        return draft_spec(dims, batch, max_context, dtype, id_dtype)
    if candidates and (phase == PREFILL or not 0 < candidates <= dims.vocab_size):
        raise ValueError(f"candidates={candidates}: only decode, extend and mixed have them, at most the vocabulary")
    if hidden and not candidates:
        raise ValueError("the hidden state comes with candidates (decode, extend and mixed)")
    ring = dims.ring_size(max_context)
    if phase == MIXED:
        if rows or per_position:
            raise ValueError("the mixed graph has no rows or per-position variants")
        return mixed_spec(dims, batch, seq_len, max_context, dtype, id_dtype, kv_heads, candidates, hidden)
    if phase == EXTEND:
        return extend_spec(dims, batch, rows or batch, seq_len, max_context, dtype, id_dtype, kv_heads, candidates,
                           per_position, hidden)
    if phase == DECODE:
        rows, s, kv_len = batch, 1, {FULL: max_context, SLIDING: ring}
    else:
        rows, s = 1, seq_len
        kv_len = {FULL: s, SLIDING: s}
    ins = [TensorSpec("input_ids", (rows, s), id_dtype), TensorSpec("position_ids", (rows, s), id_dtype)]
    if dims.ple_dim:
        ins.append(TensorSpec("per_layer_inputs", (rows, s, dims.num_layers, dims.ple_dim), dtype))
    ins += [TensorSpec("mask_full", (rows, 1, s, kv_len[FULL]), dtype),
            TensorSpec("mask_sliding", (rows, 1, s, kv_len[SLIDING]), dtype)]
    if phase == PREFILL:
        ins += [TensorSpec("last_idx", (1,), id_dtype), TensorSpec("ring_idx", (1, ring), id_dtype),
                TensorSpec("slot", (1,), id_dtype)]
        ins += media_inputs(dims, rows, s, dtype)
    kv = kv_specs(dims, batch, max_context, dtype, kv_heads)
    if candidates:
        head = (TensorSpec("candidate_values", (rows, candidates), dtype),
                TensorSpec("candidate_ids", (rows, candidates), id_dtype))
        head += (TensorSpec("hidden", (rows, dims.hidden_size), dtype),) if hidden else ()
    else:
        head = (TensorSpec("logits", (rows, dims.vocab_size), dtype),)
    return GraphSpec(phase, batch, s, max_context, tuple(ins) + kv, (*head, *kv), candidates, hidden=hidden,
                     media_ids=_media_ids(dims) if phase == PREFILL else ())



def media_inputs(dims: ModelDims, rows: int, t: int, dtype: torch.dtype) -> list[TensorSpec]:
    """`mm_embeds` [rows, T, H]: the embeddings of the media soft tokens among the T tokens (anything elsewhere),
    on the prefill and extend graphs of a model that serves media (`dims.media_ids`); none otherwise."""
    return [TensorSpec("mm_embeds", (rows, t, dims.hidden_size), dtype)] if _media_ids(dims) else []


def _media_ids(dims) -> tuple[int, ...]:
    return tuple(getattr(dims, "media_ids", ()))


def extend_spec(dims: ModelDims, batch: int, rows: int, t: int, max_context: int, dtype: torch.dtype,
                id_dtype: torch.dtype, kv_heads, candidates: int, per_position: bool,
                hidden: bool = False) -> GraphSpec:
    """The extend graph: `rows` x T new tokens over what their slots hold (`graphs.ExtendKV`). mask_full
    covers the full buffer after the write; mask_sliding the ring as it was before the chunk, then the chunk's
    own T keys. T is at most the ring (a chunk never writes one ring entry twice) and the context."""
    ring = dims.ring_size(max_context)
    if not 1 <= t <= min(ring, max_context) or not 1 <= rows <= batch:
        raise ValueError(f"extend {rows}x{t}: T must be in [1, {min(ring, max_context)}] (the ring), rows <= {batch}")
    ins = [TensorSpec("input_ids", (rows, t), id_dtype), TensorSpec("position_ids", (rows, t), id_dtype)]
    if dims.ple_dim:
        ins.append(TensorSpec("per_layer_inputs", (rows, t, dims.num_layers, dims.ple_dim), dtype))
    ins += [TensorSpec("mask_full", (rows, 1, t, max_context), dtype),
            TensorSpec("mask_sliding", (rows, 1, t, ring + t), dtype),
            TensorSpec("last_idx", (rows,), id_dtype), TensorSpec("slots", (rows,), id_dtype)]
    ins += media_inputs(dims, rows, t, dtype)
    kv = kv_specs(dims, batch, max_context, dtype, kv_heads)
    lead = (rows, t) if per_position else (rows,)
    if candidates:
        head = (TensorSpec("candidate_values", (*lead, candidates), dtype),
                TensorSpec("candidate_ids", (*lead, candidates), id_dtype))
        head += (TensorSpec("hidden", (*lead, dims.hidden_size), dtype),) if hidden else ()
    else:  # the last position's logits, or every position's (prompt logprobs)
        head = (TensorSpec("logits", (*lead, dims.vocab_size), dtype),)
    return GraphSpec(EXTEND, batch, t, max_context, tuple(ins) + kv, (*head, *kv), candidates, rows, per_position,
                     hidden, _media_ids(dims))


def mixed_spec(dims: ModelDims, batch: int, t: int, max_context: int, dtype: torch.dtype, id_dtype: torch.dtype,
               kv_heads, candidates: int, hidden: bool = False) -> GraphSpec:
    """The mixed graph (`mixed_kv.MixedKV`): tokens [0, B) are the B slots' decode tokens (slot i's at index i),
    tokens [B, B + T) one row's chunk (`slots` [1], `last_idx` [1] its last real index). Mask rows follow the
    tokens: a decode token's mask_full row is its slot's decode mask, its mask_sliding row the slot's ring mask
    (ring columns, then T masked ones); a chunk token's rows are the extend graph's. Outputs: B + 1 rows (the B
    slots, then the chunk's last position); `hidden`: their hidden states [B + 1, H] after the candidates."""
    ring = dims.ring_size(max_context)
    if not 1 <= t <= min(ring, max_context):
        raise ValueError(f"mixed {batch}x{t}: T must be in [1, {min(ring, max_context)}] (the ring)")
    n = batch + t
    ins = [TensorSpec("input_ids", (1, n), id_dtype), TensorSpec("position_ids", (1, n), id_dtype)]
    if dims.ple_dim:
        ins.append(TensorSpec("per_layer_inputs", (1, n, dims.num_layers, dims.ple_dim), dtype))
    ins += [TensorSpec("mask_full", (1, 1, n, max_context), dtype),
            TensorSpec("mask_sliding", (1, 1, n, ring + t), dtype),
            TensorSpec("last_idx", (1,), id_dtype), TensorSpec("slots", (1,), id_dtype)]
    kv = kv_specs(dims, batch, max_context, dtype, kv_heads)
    if candidates:
        head = (TensorSpec("candidate_values", (batch + 1, candidates), dtype),
                TensorSpec("candidate_ids", (batch + 1, candidates), id_dtype))
        head += (TensorSpec("hidden", (batch + 1, dims.hidden_size), dtype),) if hidden else ()
    else:
        head = (TensorSpec("logits", (batch + 1, dims.vocab_size), dtype),)
    return GraphSpec(MIXED, batch, t, max_context, tuple(ins) + kv, (*head, *kv), candidates, hidden=hidden)


def draft_spec(dims: ModelDims, batch: int, max_context: int, dtype: torch.dtype,
               id_dtype: torch.dtype) -> GraphSpec:
    """The MTP draft step over every slot (`draft_graph.DraftGraph`, the inputs `engine/mtp.py` builds): the
    tokens, the hidden states they come with (the target's or the drafter's own), the position each row drafts
    at and its masks (`draft_graph.draft_masks`); the KV it reads is the backend's, so no KV input or output."""
    ring, h = dims.ring_size(max_context), dims.hidden_size
    ins = (TensorSpec("input_ids", (batch, 1), id_dtype), TensorSpec("hidden", (batch, 1, h), dtype),
           TensorSpec("position_ids", (batch, 1), id_dtype), TensorSpec("mask_full", (batch, 1, 1, max_context), dtype),
           TensorSpec("mask_sliding", (batch, 1, 1, ring), dtype))
    outs = (TensorSpec("draft_ids", (batch, 1), id_dtype), TensorSpec("next_hidden", (batch, 1, h), dtype))
    return GraphSpec(DRAFT, batch, 1, max_context, ins, outs)
