"""Penalties: one sequence's logit changes beyond the model's own, applied to the soft-capped fp32 logits before
temperature, top-k, top-p and any grammar mask.

In order: `logit_bias` (OpenAI: added to the token's logit), then `repetition_penalty` (transformers'
`RepetitionPenaltyLogitsProcessor`: a token seen in the prompt or the output has a positive logit divided by
the penalty, a negative one multiplied), then `frequency_penalty` and `presence_penalty` (OpenAI's: minus
frequency x count minus presence x [count > 0], counted over the output only). vLLM applies them in the same
order. Gemma-4's logits are soft-capped inside the HF forward, so penalizing the capped values is what
transformers' `generate` does. Logprobs stay the model's distribution (`distribution.sample_full_row`).

The state is sparse: only the ids a penalty touches (biased, seen with a repetition penalty, or in the output)
are kept (`ids`, with their bias, seen flag and count), so a step costs O(touched ids), not O(vocabulary): the
262,144-token vocabulary is capped and copied only for rows that draw from all of it (the others read it
through one buffer the sequence keeps, `untouched`).
"""

from __future__ import annotations

import torch

from neuron_workers.engine.params import SamplingParams


class Penalties:
    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab: int):
        self._buffer = None  # fp32 [vocab], made on first use: `untouched`
        self.repetition = params.repetition_penalty
        self.frequency, self.presence = params.frequency_penalty, params.presence_penalty
        start = dict(params.logit_bias)  # id -> bias; then the prompt's ids (0 bias) when they count
        if self.repetition != 1.0:
            for t in prompt_ids:
                start.setdefault(t, 0.0)
        self.index = {t: i for i, t in enumerate(start)}
        self.ids = torch.tensor(list(start), dtype=torch.int64)  # the touched ids
        self.bias = torch.tensor(list(start.values()), dtype=torch.float32)
        self.seen = torch.zeros(len(start), dtype=torch.bool)  # seen in the prompt or the output
        if self.repetition != 1.0 and prompt_ids:
            self.seen[torch.tensor([self.index[t] for t in set(prompt_ids)])] = True
        self.counts = torch.zeros(len(start), dtype=torch.float32)  # in the output

    def add(self, token: int) -> None:
        """An output token: it counts for every penalty from the next step on."""
        i = self.index.get(token)
        if i is None:
            i = self.index[token] = len(self.index)
            self.ids = torch.cat([self.ids, torch.tensor([token], dtype=torch.int64)])
            self.bias = torch.cat([self.bias, torch.zeros(1)])
            self.seen = torch.cat([self.seen, torch.zeros(1, dtype=torch.bool)])
            self.counts = torch.cat([self.counts, torch.zeros(1)])
        self.seen[i] = True
        self.counts[i] += 1

    def untouched(self, logits: torch.Tensor) -> torch.Tensor:
        """One row's logits [vocab] as fp32 with the touched ids at -inf, in this sequence's own buffer (a fresh
        1 MiB tensor a step would cost page faults as large as the work; valid until the next call)."""
        if self._buffer is None or self._buffer.shape != logits.shape:
            self._buffer = torch.empty(logits.shape, dtype=torch.float32)
        self._buffer.copy_(logits)
        self._buffer[self.ids] = float("-inf")
        return self._buffer

    def values(self, capped: torch.Tensor) -> torch.Tensor:
        """The penalized values of the touched ids, from their soft-capped fp32 logits capped [len(ids)]."""
        z = capped + self.bias
        if self.repetition != 1.0:
            z = torch.where(self.seen & (z > 0), z / self.repetition, torch.where(self.seen, z * self.repetition, z))
        return z - self.frequency * self.counts - self.presence * (self.counts > 0).float()

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        """The penalized copy of one row's soft-capped fp32 logits z [vocab] (for rows that need all of it)."""
        z = z.clone()
        z[self.ids] = self.values(z[self.ids])
        return z
