"""GraphSpec: the declared, ordered inputs and outputs of one compiled graph (a prefill bucket or the
decode step).

The tracer (compile/), the backends and the engine all build argument tuples from `GraphSpec.inputs`,
so the order of graph inputs is written down exactly once. `GraphSpec.outputs` is
`(logits [rows, vocab], *kv)` with kv in the same order as the kv inputs (k0, v0, k1, v1, ...).

Batching: the KV buffers hold `batch` rows (slots), one per running sequence. The decode graph takes one
token for every row; a prefill graph takes one prompt (batch 1, padded to its bucket) and writes it into
the row named by its `slot` input, leaving every other row as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_workers.model.dims import FULL, SLIDING, ModelDims

PREFILL, DECODE = "prefill", "decode"
KV_PREFIXES = ("k.", "v.")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def zeros(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype)


@dataclass(frozen=True, slots=True)
class GraphSpec:
    phase: str  # prefill | decode
    batch: int  # KV rows (slots); decode runs all of them, prefill writes one
    seq_len: int  # the prefill bucket, 1 for decode
    max_context: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]  # logits (raw, without the soft-cap), then the updated KV buffers

    @property
    def tag(self) -> str:
        return f"{self.phase}_{self.seq_len}" if self.phase == PREFILL else DECODE

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
              kv_heads: tuple[int, ...] | None = None) -> GraphSpec:
    """Inputs of a prefill graph (seq_len = bucket, one prompt into one of `batch` slots) or of the
    decode graph (one token for each of the `batch` rows)."""
    if phase not in (PREFILL, DECODE):
        raise ValueError(f"unknown phase {phase!r}")
    ring = dims.ring_size(max_context)
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
    kv = kv_specs(dims, batch, max_context, dtype, kv_heads)
    outs = (TensorSpec("logits", (rows, dims.vocab_size), dtype), *kv)
    return GraphSpec(phase, batch, s, max_context, tuple(ins) + kv, outs)
