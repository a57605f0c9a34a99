"""Which drafted tokens a verify step keeps, per row, so that the output is the target model's own.

A verify step fed a row its last token and k drafts and returned, for each of the k + 1 positions, the
target's top-K candidates (`spec.Candidates` [R, T, K]). Greedy rows keep the longest prefix of the drafts
that equals the target's argmax at each position, then the target's token at the first mismatch (or after
the last draft): the tokens plain decoding would give. Sampled rows do the same with draws: both drafters'
drafts are deterministic (q puts all mass on the draft), so drawing x from the target's p at each position
with the row's own generator, emitting it and going on only while x equals the draft has exactly the
distribution of rejection sampling, and takes one random number per emitted token through the very code
plain decoding samples with (`sampling.sample_top_k_rows`). So a seeded row emits the same tokens with or
without speculation, whatever its neighbours do (steps without drafts draw one number per token too).
"""

from __future__ import annotations

import torch

from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.rows import soft_cap
from neuron_workers.engine.sampling import sample_top_k_rows
from neuron_workers.engine.topk import TopCandidates, canonical
from neuron_workers.model.spec import Candidates


def greedy_tokens(cands: Candidates, row: int, drafts: list[int]) -> list[int]:
    """The tokens a greedy row emits: matching drafts, then the target's own token."""
    view = TopCandidates(Candidates(cands.values[row], cands.ids[row]))  # [T, K]: positions as rows
    best = view.argmax(torch.arange(len(drafts) + 1)).tolist()
    out = []
    for d, b in zip(drafts, best):
        out.append(b)
        if b != d:
            return out
    return out + [best[len(drafts)]]


def target_probs(values: torch.Tensor, ids: torch.Tensor, params: SamplingParams, cap: float | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distribution at one position from its K candidates: (probs [k], ids [k]) after the soft
    cap, temperature, top-k and top-p, exactly what `sampling.sample_top_k_rows` draws from."""
    vals, top = canonical(values[None].float(), ids[None].long(), params.top_k)
    probs = torch.softmax(soft_cap(vals[0], cap) / params.temperature, dim=-1)
    cdf = torch.cumsum(probs, -1)
    probs = torch.where(cdf - probs < params.top_p, probs, 0.0)
    return probs / probs.sum(), top[0]


def sampled_tokens(cands: Candidates, row: int, drafts: list[int], params: SamplingParams, cap: float | None,
                   generator) -> list[int]:
    """The tokens a sampled row emits: one draw per position, as plain decoding would make, while they match."""
    view = TopCandidates(Candidates(cands.values[row], cands.ids[row]))  # [T, K]: positions as rows
    temperature, top_p = torch.tensor([params.temperature]), torch.tensor([params.top_p])
    out = []
    for j in range(len(drafts) + 1):
        out.append(int(sample_top_k_rows(view, torch.tensor([j]), params.top_k, temperature, top_p, [generator],
                                         cap)[0]))
        if j == len(drafts) or out[-1] != drafts[j]:
            return out
    return out
