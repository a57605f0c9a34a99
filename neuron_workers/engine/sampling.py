"""Host-side token selection from raw (un-capped) graph logits, for every row of a decode step at once.

Greedy takes argmax of the raw logits: the soft-cap is monotone, so the choice is the same. Sampling
and logprobs need the capped values, computed here in fp32 (`cap * tanh(z / cap)`): in bf16 the cap
creates ties near +-cap. Temperature, then top-k, then top-p, then a draw from the row's own seeded
generator (one per sequence, so a request samples the same tokens whatever shares its batch).

`sample_rows` vectorises the common cases over the batch: all greedy rows in one argmax, sampled rows
with the same top-k in one top-k / softmax / top-p / draw; rows without top-k go one by one. Each row's
result depends only on its own logits, parameters and generator. A step's scores come either as full
logits [B, vocab] or, from the `decode` graph (top-K variant), as each row's K best (`spec.Candidates`); greedy
and top-k rows read them through `topk.Chunked` / `topk.TopCandidates`, which never copy the vocabulary
to fp32 and give the same answers (the soft-cap and fp32 math run on the k candidates only). Rows that
need the whole distribution (no top-k, logprobs, a grammar mask, penalties or a logit bias: `needs_logits`) pay
for it alone.
"""

from __future__ import annotations

import torch

from neuron_workers.engine.distribution import sample_full_row
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.rows import Row, Sampled, make_generator, soft_cap
from neuron_workers.engine.topk import NUM_CHUNKS, Chunked, TopCandidates, serves
from neuron_workers.model.spec import Candidates

__all__ = ["Chunked", "NUM_CHUNKS", "Row", "Sampled", "make_generator", "needs_logits", "sample", "sample_rows",
           "soft_cap"]


def sample(logits: torch.Tensor, params: SamplingParams, cap: float | None,
           generator: torch.Generator | None) -> int:
    """One token id from logits [vocab] (raw, as the graph returns them): the one-row path, for rows that
    `sample_rows` does not vectorise (no top-k, or a top-k over 1024)."""
    logits = logits.float()
    if params.greedy:
        return int(torch.argmax(logits))
    if params.top_k and params.top_k < logits.shape[-1]:
        z, idx = torch.topk(logits, params.top_k)  # the cap is monotone: same top k before and after
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


def sample_top_k_rows(chunked: Chunked | TopCandidates, idx: torch.Tensor, k: int, temperature: torch.Tensor,
                      top_p: torch.Tensor, generators: list, cap: float | None) -> torch.Tensor:
    """One token for each row `idx` of the logits, all with the same top-k, each with its own
    temperature, top-p and generator."""
    vals, ids = chunked.topk(idx, k)  # the cap is monotone: same top k before and after
    probs = torch.softmax(soft_cap(vals, cap) / temperature[:, None], dim=-1)
    cdf = torch.cumsum(probs, -1)
    probs = torch.where(cdf - probs < top_p[:, None], probs, 0.0)  # nucleus: always keeps the top token
    cdf = torch.cumsum(probs, -1)
    u = torch.stack([torch.rand((), generator=g) for g in generators]) * cdf[:, -1]
    choice = torch.searchsorted(cdf, u[:, None], right=True).clamp_(max=k - 1)
    return ids.gather(1, choice)[:, 0]


def needs_logits(row: Row, k_compiled: int) -> bool:
    """Whether this row needs the step's full logits, not just the top `k_compiled` candidates."""
    return row.full or not serves(k_compiled, row.params)


def sample_rows(scores: torch.Tensor | Candidates, rows: list[Row], cap: float | None) -> list[Sampled]:
    """A token for each row from logits [B, vocab] or a step's top-K `Candidates`; returned in the order of
    `rows`. Rows with a grammar mask, logprobs or penalties take the full-distribution path
    (`distribution.sample_full_row`) and pay for it alone; the others are vectorised below, and a row's
    result never depends on the other rows. With candidates, every row must be served by them
    (`needs_logits` false): one that is not gets an error."""
    if isinstance(scores, Candidates):
        k = scores.values.shape[1]
        bad = [r for r in rows if needs_logits(r, k)]
        out = {r.slot: Sampled(-1, error="this row needs the full logits, the step returned top-K candidates")
               for r in bad}
        plain = [r for r in rows if r.slot not in out]
        view = TopCandidates(scores)
    else:
        full = {r.slot for r in rows if r.full}
        plain = [r for r in rows if r.slot not in full]
        out = {r.slot: sample_full_row(scores[r.slot], r, cap) for r in rows if r.slot in full}
        view = Chunked(scores) if plain else None
    if plain:
        out.update(zip((r.slot for r in plain), map(Sampled, _plain_tokens(view, plain, cap))))
    return [out[r.slot] for r in rows]


def _plain_tokens(view: Chunked | TopCandidates, rows: list[Row], cap: float | None) -> list[int]:
    """Tokens for rows without a mask, logprobs or penalties: greedy rows in one argmax, rows with the same top-k in
    one vectorised draw, others one by one on their own fp32 row."""
    vocab = view.logits.shape[1] if isinstance(view, Chunked) else None
    out: dict[int, int] = {}
    greedy = [r for r, p, *_ in rows if p.greedy]
    if greedy:
        out.update(zip(greedy, view.argmax(torch.tensor(greedy)).tolist()))
    groups: dict[int, list] = {}
    for r, p, g, *_ in rows:
        if p.greedy:
            continue
        if 0 < p.top_k <= NUM_CHUNKS and (vocab is None or p.top_k < vocab):
            groups.setdefault(p.top_k, []).append((r, p, g))
        else:
            out[r] = sample(view.row(r), p, cap, g)
    for k, members in groups.items():
        idx = torch.tensor([r for r, _, _ in members])
        temps = torch.tensor([p.temperature for _, p, _ in members])
        top_p = torch.tensor([p.top_p for _, p, _ in members])
        toks = sample_top_k_rows(view, idx, k, temps, top_p, [g for _, _, g in members], cap)
        out.update(zip(idx.tolist(), toks.tolist()))
    return [out[r.slot] for r in rows]
