"""The backend boundary: what runs the graph modules. Chosen once, when a worker starts.

`cpu.CpuBackend` runs the graphs in this process (eager, strict torch.export programs or inductor);
`cpu_tp.TpCpuBackend` runs them sharded over torch.distributed ranks (gloo); `neuron.NeuronBackend` runs
graphs compiled by neuronx-cc through NxD. Only `neuron_workers.backends.neuron*` may import Neuron
packages, and only when that backend is asked for.
"""

from __future__ import annotations

from typing import Protocol

import torch

from neuron_workers.spec import GraphSpec


class Backend(Protocol):
    """Owns the KV buffers ([max_batch, ...] per KV layer) between calls.

    Call order: `prefill(bucket, inputs)` writes one prompt into the slot its inputs name, then
    `decode(inputs)` advances every row by one token, repeatedly; prefills may come between decodes.
    `inputs` are the spec's host inputs (`GraphSpec.host_inputs`), in order."""

    max_context: int
    max_batch: int
    buckets: tuple[int, ...]

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec: ...

    def prefill(self, bucket: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run the prefill graph of `bucket`; returns logits [1, vocab] (raw, no soft-cap)."""
        ...

    def decode(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run one decode step for all rows; returns logits [max_batch, vocab] (raw, no soft-cap)."""
        ...

    def close(self) -> None: ...
