"""Host-side token selection from raw (un-capped) graph logits.

Greedy takes argmax of the raw logits: the soft-cap is monotone, so the choice is the same. Sampling
and logprobs need the capped values, computed here in fp32 (`cap * tanh(z / cap)`): in bf16 the cap
creates ties near +-cap. Temperature, then top-k, then top-p, then a draw from a seeded generator.
"""

from __future__ import annotations

import torch

from neuron_workers.params import SamplingParams


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    logits = logits.float()
    return logits if not cap else cap * torch.tanh(logits / cap)


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return g


CHUNK_ROWS = 1024  # 262,144-wide logits as 1024 rows of 256: row maxima first, then one row


def fast_argmax(z: torch.Tensor) -> int:
    """torch.argmax(z) for 1-D z (same first-index tie rule), about 15x faster on a 262K vocab:
    the vectorised row max finds the row, then argmax runs over that row alone."""
    if z.numel() % CHUNK_ROWS:
        return int(torch.argmax(z))
    rows = z.view(CHUNK_ROWS, -1)
    r = int(rows.amax(dim=1).argmax())
    return r * rows.shape[1] + int(rows[r].argmax())


def fast_topk(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(z, k) for 1-D z: the top k values lie in the k rows with the largest maxima."""
    if z.numel() % CHUNK_ROWS or k > CHUNK_ROWS:
        return torch.topk(z, k)
    rows = z.view(CHUNK_ROWS, -1)
    best = rows.amax(dim=1).topk(k).indices
    vals, i = rows.index_select(0, best).reshape(-1).topk(k)
    return vals, best[i // rows.shape[1]] * rows.shape[1] + i % rows.shape[1]


def sample(logits: torch.Tensor, params: SamplingParams, cap: float | None,
           generator: torch.Generator | None) -> int:
    """One token id from logits [vocab] (raw, as the graph returns them)."""
    logits = logits.float()
    if params.greedy:
        return fast_argmax(logits)
    if params.top_k and params.top_k < logits.shape[-1]:
        z, idx = fast_topk(logits, params.top_k)  # the cap is monotone: same top k before and after
        z = soft_cap(z, cap) / params.temperature
    else:
        z = soft_cap(logits, cap) / params.temperature
        z, idx = torch.sort(z, descending=True) if params.top_p < 1.0 else (z, None)
    probs = torch.softmax(z, dim=-1)
    cdf = torch.cumsum(probs, -1)
    if params.top_p < 1.0:  # nucleus: keep the smallest prefix reaching top_p (always the top token)
        probs = torch.where(cdf - probs < params.top_p, probs, 0.0)
        cdf = torch.cumsum(probs, -1)
    u = torch.rand((), generator=generator) * cdf[-1]  # inverse-CDF draw: one random number per token
    choice = min(int(torch.searchsorted(cdf, u, right=True)), cdf.shape[-1] - 1)
    return int(idx[choice]) if idx is not None else choice
