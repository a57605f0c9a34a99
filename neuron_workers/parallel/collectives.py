"""The collectives the tensor-parallel layers call, injected so one set of layers serves every backend:
torch.distributed (gloo) on CPU, NxD's mappings (XLA collectives in the traced graph) on Neuron. NxD is
imported only inside `NxdCollectives`' methods, when a Neuron trace calls them."""

from __future__ import annotations

from typing import Protocol

import torch


class Collectives(Protocol):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor: ...


class TorchDistCollectives:
    """torch.distributed collectives (gloo on CPU) over the default process group."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=dim)


class NxdCollectives:
    """Collectives over NxD's tensor-parallel group (XLA collectives in the traced graph)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        from neuronx_distributed.parallel_layers.mappings import reduce_from_tensor_model_parallel_region

        return reduce_from_tensor_model_parallel_region(x)

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        from neuronx_distributed.parallel_layers.mappings import gather_from_tensor_model_parallel_region

        if dim not in (-1, x.dim() - 1):
            raise ValueError("NxD gathers along the last dimension only")
        return gather_from_tensor_model_parallel_region(x)
