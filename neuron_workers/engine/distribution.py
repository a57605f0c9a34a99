"""Rows that need the whole distribution: a grammar's token mask, or logprobs. They pay for the full
vocabulary alone; rows beside them take the vectorised path in `sampling.sample_rows`.

Logprobs are the log-softmax of the soft-capped fp32 logits: the model's distribution before temperature,
top-k, top-p and any grammar mask (vLLM's default). A mask removes tokens after the soft-cap (a capped
logit is finite, so masking before it would leave masked tokens a probability); greedy rows take the
argmax of the masked raw logits (the cap is monotone, and raw values have no cap-made ties).
"""

from __future__ import annotations

import torch

from neuron_workers.engine.sampling import Row, Sampled, soft_cap

_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [ceil(vocab / 32)] (bit j of word i: token 32 i + j allowed) -> bool [vocab]."""
    return ((bitmask.reshape(-1, 1) >> _BITS) & 1).bool().reshape(-1)[:vocab]


def sample_full_row(logits: torch.Tensor, row: Row, cap: float | None) -> Sampled:
    """One row's token (and logprobs when asked) from its raw logits [vocab]."""
    raw = logits.float()
    ok = unpack_bitmask(row.allowed, raw.shape[-1]) if row.allowed is not None else None
    if ok is not None and not bool(ok.any()):
        return Sampled(-1, error="the grammar allows no next token")
    p = row.params
    if p.greedy:
        token = int(torch.argmax(raw if ok is None else raw.masked_fill(~ok, float("-inf"))))
    else:
        z = soft_cap(raw, cap)
        token = _draw(z if ok is None else z.masked_fill(~ok, float("-inf")), p, row.generator)
    if row.logprobs is None:
        return Sampled(token)
    lp = torch.log_softmax(soft_cap(raw, cap), dim=-1)
    top = torch.topk(lp, row.logprobs) if row.logprobs else None
    pairs = tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ()
    return Sampled(token, float(lp[token]), pairs)


def _draw(z: torch.Tensor, p, generator) -> int:
    """Temperature, top-k, top-p and an inverse-CDF draw over capped values z [vocab] (-inf: masked)."""
    idx = None
    if p.top_k and p.top_k < z.shape[-1]:
        z, idx = torch.topk(z, p.top_k)
    elif p.top_p < 1.0:
        z, idx = torch.sort(z, descending=True)
    probs = torch.softmax(z / p.temperature, dim=-1)
    cdf = torch.cumsum(probs, -1)
    if p.top_p < 1.0:  # nucleus: keep the smallest prefix reaching top_p (always the top token)
        probs = torch.where(cdf - probs < p.top_p, probs, 0.0)
        cdf = torch.cumsum(probs, -1)
    u = torch.rand((), generator=generator) * cdf[-1]
    choice = min(int(torch.searchsorted(cdf, u, right=True)), cdf.shape[-1] - 1)
    while probs[choice] == 0 and choice > 0:  # never land on a masked or cut token
        choice -= 1
    return int(idx[choice]) if idx is not None else choice
