"""The backend skeleton every backend shares: the spec cache and the prefill / decode dispatch.

A backend owns the KV buffers ([max_batch, ...] per KV layer) between calls. Call order:
`prefill(bucket, inputs)` writes one prompt into the slot its inputs name, then `decode(inputs)` advances
every slot by one token, repeatedly; prefills may come between decodes. `inputs` are the spec's host
inputs (`GraphSpec.host_inputs`), in order. Subclasses implement `_run(spec, inputs)` only.
"""

from __future__ import annotations

from typing import Protocol

import torch

from neuron_workers.model.dims import ModelDims
from neuron_workers.model.spec import DECODE, PREFILL, GraphSpec, make_spec


class Backend(Protocol):
    """What the engine needs of a backend."""

    max_context: int
    max_batch: int
    buckets: tuple[int, ...]

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec: ...

    def prefill(self, bucket: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run the prefill graph of `bucket`; returns logits [1, vocab] (raw, no soft-cap)."""
        ...

    def decode(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run one decode step for all slots; returns logits [max_batch, vocab] (raw, no soft-cap)."""
        ...

    def close(self) -> None: ...


class GraphBackend:
    """Shared plumbing: one `GraphSpec` per graph, built once (decode asks for its spec every token), and
    prefill / decode routed to `_run` with that spec."""

    id_dtype: torch.dtype = torch.int64

    def __init__(self, dims: ModelDims, max_context: int, buckets, max_batch: int, dtype: torch.dtype,
                 kv_heads: tuple[int, ...] | None = None):
        self.dims, self.dtype, self.kv_heads = dims, dtype, kv_heads  # kv_heads: a TP rank's (None: unsharded)
        self.max_context, self.buckets, self.max_batch = max_context, tuple(sorted(buckets)), max_batch
        self._specs: dict[tuple[str, int], GraphSpec] = {}

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec:
        key = (phase, bucket if phase == PREFILL else 1)
        if key not in self._specs:
            self._specs[key] = make_spec(self.dims, phase, self.max_batch, key[1], self.max_context, self.dtype,
                                         self.id_dtype, self.kv_heads)
        return self._specs[key]

    def prefill(self, bucket: int, inputs) -> torch.Tensor:
        return self._run(self.spec(PREFILL, bucket), inputs)

    def decode(self, inputs) -> torch.Tensor:
        return self._run(self.spec(DECODE), inputs)

    def _run(self, spec: GraphSpec, inputs) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        pass
