"""Which drafted tokens a verify step keeps, per row, so that the output is the target model's own.

A verify step fed a row its last token and k drafts and returned, for each of the k + 1 positions, the
target's top-K candidates (`spec.Candidates` [R, T, K]). Greedy rows keep the longest prefix of the drafts
that equals the target's argmax at each position, then the target's token at the first mismatch (or after
the last draft): the tokens plain decoding would give. Sampled rows use speculative (rejection) sampling
with the row's own generator: the drafts are deterministic guesses (q puts all mass on the draft), so draft
d is kept with probability p(d), and at the first rejection the token is drawn from p with d removed
(renormalised); after the last kept draft one more token comes from p. Each emitted token is distributed as
the target's p (temperature, top-k, top-p as in `sampling`), whatever the drafts were.
"""

from __future__ import annotations

import torch

from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.rows import soft_cap
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


def _draw(probs: torch.Tensor, ids: torch.Tensor, generator) -> int:
    cdf = torch.cumsum(probs, -1)
    u = torch.rand((), generator=generator) * cdf[-1]
    return int(ids[min(int(torch.searchsorted(cdf, u, right=True)), len(ids) - 1)])


def sampled_tokens(cands: Candidates, row: int, drafts: list[int], params: SamplingParams, cap: float | None,
                   generator) -> list[int]:
    """The tokens a sampled row emits under speculative sampling."""
    out = []
    for j, d in enumerate(drafts):
        probs, ids = target_probs(cands.values[row, j], cands.ids[row, j], params, cap)
        hit = (ids == d).nonzero()
        p_d = float(probs[hit[0, 0]]) if len(hit) else 0.0
        if float(torch.rand((), generator=generator)) < p_d:
            out.append(d)
            continue
        if len(hit):
            probs = probs.clone()
            probs[hit[0, 0]] = 0.0
        return out + [_draw(probs / probs.sum(), ids, generator)]
    probs, ids = target_probs(cands.values[row, len(drafts)], cands.ids[row, len(drafts)], params, cap)
    return out + [_draw(probs, ids, generator)]
