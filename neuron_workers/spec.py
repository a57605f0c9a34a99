"""GraphSpec: the declared, ordered inputs of one compiled graph (a prefill bucket or the decode step).

The tracer (compile/), the backends and the engine all build argument tuples from `GraphSpec.inputs`,
so the order of graph inputs is written down exactly once. Outputs are always
`(logits [B, vocab], *kv)` with kv in the same order as the kv inputs (k0, v0, k1, v1, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_workers.dims import FULL, ModelDims

PREFILL, DECODE = "prefill", "decode"


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
    batch: int
    seq_len: int  # the prefill bucket, 1 for decode
    max_context: int
    inputs: tuple[TensorSpec, ...]

    @property
    def tag(self) -> str:
        return f"{self.phase}_{self.seq_len}" if self.phase == PREFILL else DECODE

    @property
    def num_kv(self) -> int:
        return sum(1 for t in self.inputs if t.name.startswith(("k.", "v.")))

    @property
    def kv_inputs(self) -> tuple[TensorSpec, ...]:
        return self.inputs[len(self.inputs) - self.num_kv:]

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
    """Inputs of a prefill graph (seq_len = bucket) or the decode graph (seq_len = 1)."""
    if phase not in (PREFILL, DECODE):
        raise ValueError(f"unknown phase {phase!r}")
    if phase == DECODE:
        seq_len = 1
    b, s, ring = batch, seq_len, dims.ring_size(max_context)
    kv_len = {FULL: s if phase == PREFILL else max_context, "sliding": s if phase == PREFILL else ring}
    ins = [TensorSpec("input_ids", (b, s), id_dtype), TensorSpec("position_ids", (b, s), id_dtype)]
    if dims.ple_dim:
        ins.append(TensorSpec("per_layer_inputs", (b, s, dims.num_layers, dims.ple_dim), dtype))
    ins += [TensorSpec("mask_full", (b, 1, s, kv_len[FULL]), dtype),
            TensorSpec("mask_sliding", (b, 1, s, kv_len["sliding"]), dtype)]
    if phase == PREFILL:
        ins += [TensorSpec("last_idx", (b,), id_dtype), TensorSpec("ring_idx", (b, ring), id_dtype)]
    ins += kv_specs(dims, batch, max_context, dtype, kv_heads)
    return GraphSpec(phase, batch, s, max_context, tuple(ins))
