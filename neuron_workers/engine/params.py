"""SamplingParams: what one request asks of the sampler and the stop rules. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_workers.errors import UserError

GREEDY_BELOW = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0  # 0 -> off
    top_p: float = 1.0  # 1 -> off
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise UserError(f"max_tokens must be a positive integer, got {self.max_tokens!r}",
                            param="max_tokens")
        if not 0.0 <= self.temperature <= 2.0:
            raise UserError(f"temperature must be in [0, 2], got {self.temperature}", param="temperature")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0, got {self.top_k}", param="top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")

    @property
    def greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW are greedy (vLLM's rule): dividing fp32 logits by 1e-300 makes
        inf, then NaN probabilities, and an arbitrary token."""
        return self.temperature < GREEDY_BELOW
