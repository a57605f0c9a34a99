"""What a decode step's sampler takes and gives per row (`Row`, `Sampled`), the soft-cap and the per-sequence
seeded generator: the pieces `sampling` (vectorised rows) and `distribution` (masks, logprobs) share, so
that neither imports the other's module for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from neuron_workers.engine.params import SamplingParams


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    logits = logits.float()
    return logits if not cap else cap * torch.tanh(logits / cap)


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return g


class Row(NamedTuple):
    """What one row of a step asks of the sampler."""

    slot: int  # the row of the logits
    params: SamplingParams
    generator: torch.Generator | None
    allowed: torch.Tensor | None = None  # int32 token bitmask [ceil(vocab / 32)] from the row's grammar
    logprobs: int | None = None  # None: none; n >= 0: the chosen token's logprob and the top n
    penalty: object | None = None  # penalties.Penalties: logit bias and penalties change the row's logits

    @property
    def full(self) -> bool:
        """Whether sampling this row needs its whole distribution (`distribution.sample_full_row`)."""
        return self.allowed is not None or self.logprobs is not None or self.penalty is not None


@dataclass(frozen=True, slots=True)
class Sampled:
    token: int
    logprob: float | None = None  # log-softmax of the soft-capped fp32 logits (the model's distribution)
    top: tuple[tuple[int, float], ...] = ()  # the top `logprobs` (token, logprob), best first
    error: str | None = None  # this row alone could not be sampled (e.g. its grammar allows no token)
    param: str | None = None  # with error: the request field whose grammar failed (the user's error)
