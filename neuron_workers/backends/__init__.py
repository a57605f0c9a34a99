"""The backend boundary: what runs the graph modules. Chosen once, by name, when a worker starts.

`cpu` runs the graphs in this process (eager or as strict torch.export programs); `cpu-tp` runs them
sharded over torch.distributed ranks; `neuron` runs graphs compiled by torch_neuronx / neuronx_distributed.
Only `neuron_workers.backends.neuron` may import Neuron packages, and only when that backend is asked for.
"""

from __future__ import annotations

from typing import Protocol

import torch

from neuron_workers.spec import GraphSpec

BACKENDS = ("cpu", "neuron")


class Backend(Protocol):
    """Owns the KV buffers between calls. Call order: prefill(bucket, ...) then decode(...) repeatedly."""

    max_context: int
    buckets: tuple[int, ...]

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec: ...

    def prefill(self, bucket: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run the prefill graph of `bucket` on the non-KV inputs; returns logits [B, vocab]."""

    def decode(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run one decode step on the non-KV inputs; returns logits [B, vocab]."""

    def close(self) -> None: ...
