"""Penalties: one sequence's logit changes beyond the model's own, kept as vocabulary-sized state and applied
to the soft-capped fp32 logits before temperature, top-k, top-p and any grammar mask.

In order: `logit_bias` (OpenAI: added to the token's logit), then `repetition_penalty` (transformers'
`RepetitionPenaltyLogitsProcessor`: a token seen in the prompt or the output has a positive logit divided by
the penalty, a negative one multiplied), then `frequency_penalty` and `presence_penalty` (OpenAI's: minus
frequency x count minus presence x [count > 0], counted over the output only). vLLM applies them in the same
order. Gemma-4's logits are soft-capped inside the HF forward, so penalizing the capped values is what
transformers' `generate` does. Logprobs stay the model's distribution (`distribution.sample_full_row`).
"""

from __future__ import annotations

import torch

from neuron_workers.engine.params import SamplingParams


class Penalties:
    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab: int):
        self.repetition = params.repetition_penalty
        self.frequency, self.presence = params.frequency_penalty, params.presence_penalty
        ids = [t for t, _ in params.logit_bias]
        self.bias_ids = torch.tensor(ids, dtype=torch.int64)
        self.bias = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32)
        self.seen = torch.zeros(vocab, dtype=torch.bool) if self.repetition != 1.0 else None
        if self.seen is not None:
            self.seen[torch.tensor(prompt_ids, dtype=torch.int64)] = True
        counting = self.frequency != 0.0 or self.presence != 0.0
        self.counts = torch.zeros(vocab, dtype=torch.float32) if counting else None

    def add(self, token: int) -> None:
        """An output token: it counts for every penalty from the next step on."""
        if self.seen is not None:
            self.seen[token] = True
        if self.counts is not None:
            self.counts[token] += 1

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        """The penalized copy of one row's soft-capped fp32 logits z [vocab]."""
        z = z.clone()
        if self.bias_ids.numel():
            z.index_add_(0, self.bias_ids, self.bias)
        if self.seen is not None:
            seen = z[self.seen]
            z[self.seen] = torch.where(seen > 0, seen / self.repetition, seen * self.repetition)
        if self.counts is not None:
            z -= self.frequency * self.counts + self.presence * (self.counts > 0).float()
        return z
