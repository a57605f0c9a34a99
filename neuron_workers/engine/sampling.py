"""Host-side token selection from raw (un-capped) graph logits, for every row of a decode step at once.

Greedy takes argmax of the raw logits: the soft-cap is monotone, so the choice is the same. Sampling
and logprobs need the capped values, computed here in fp32 (`cap * tanh(z / cap)`): in bf16 the cap
creates ties near +-cap. Temperature, then top-k, then top-p, then a draw from the row's own seeded
generator (one per sequence, so a request samples the same tokens whatever shares its batch).

`sample_rows` vectorises the common cases over the batch: all greedy rows in one argmax, sampled rows
with the same top-k in one top-k / softmax / top-p / draw; rows without top-k go one by one. Each row's
result depends only on its own logits, parameters and generator.
"""

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


NUM_CHUNKS = 1024  # 262,144-wide logits as 1024 chunks of 256: chunk maxima first, then inside the best


class Chunked:
    """Logits [B, vocab] in fp32 (an exact copy of bf16) viewed as B x 1024 chunks, with every chunk's
    maximum computed once per step and shared by the greedy and the top-k rows."""

    def __init__(self, logits: torch.Tensor):
        self.z = logits.float()
        b, vocab = self.z.shape
        self.ok = vocab % NUM_CHUNKS == 0
        if self.ok:
            self.rows = self.z.view(b, NUM_CHUNKS, -1)
            self.maxima = self.rows.amax(dim=2)  # [B, 1024]

    def argmax(self, idx: torch.Tensor) -> torch.Tensor:
        """torch.argmax(z[idx], dim=1), first index on ties: the winning chunk, then argmax inside it."""
        if not self.ok:
            return self.z.index_select(0, idx).argmax(dim=1)
        r = self.maxima.index_select(0, idx).argmax(dim=1)
        return r * self.rows.shape[2] + self.rows[idx, r].argmax(dim=1)

    def topk(self, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """torch.topk(z[idx], k, dim=1): a row's top k lie in its k chunks with the largest maxima."""
        if not self.ok or k > NUM_CHUNKS:
            return self.z.index_select(0, idx).topk(k, dim=1)
        width = self.rows.shape[2]
        best = self.maxima.index_select(0, idx).topk(k, dim=1).indices  # [n, k] chunk ids
        cand = self.rows[idx[:, None], best].reshape(len(idx), k * width)
        vals, i = cand.topk(k, dim=1)
        return vals, best.gather(1, i // width) * width + i % width


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


def sample_top_k_rows(chunked: Chunked, idx: torch.Tensor, k: int, temperature: torch.Tensor,
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


class Row(NamedTuple):
    """What one row of a step asks of the sampler."""

    slot: int  # the row of the logits
    params: SamplingParams
    generator: torch.Generator | None
    allowed: torch.Tensor | None = None  # int32 token bitmask [ceil(vocab / 32)] from the row's grammar
    logprobs: int | None = None  # None: none; n >= 0: the chosen token's logprob and the top n


@dataclass(frozen=True, slots=True)
class Sampled:
    token: int
    logprob: float | None = None  # log-softmax of the soft-capped fp32 logits (the model's distribution)
    top: tuple[tuple[int, float], ...] = ()  # the top `logprobs` (token, logprob), best first
    error: str | None = None  # this row alone could not be sampled (e.g. its grammar allows no token)


def sample_rows(logits: torch.Tensor, rows: list[Row], cap: float | None) -> list[Sampled]:
    """A token for each row from logits [B, vocab]; returned in the order of `rows`. Rows with a grammar
    mask or logprobs take the full-distribution path (`distribution.sample_full_row`) and pay for it alone;
    the others are vectorised below, and a row's result never depends on the other rows."""
    from neuron_workers.engine.distribution import sample_full_row

    full = {r.slot for r in rows if r.allowed is not None or r.logprobs is not None}
    plain = [r for r in rows if r.slot not in full]
    out: dict[int, Sampled] = {r.slot: sample_full_row(logits[r.slot], r, cap) for r in rows if r.slot in full}
    if plain:
        out.update(zip((r.slot for r in plain), map(Sampled, _plain_tokens(logits, plain, cap))))
    return [out[r.slot] for r in rows]


def _plain_tokens(logits: torch.Tensor, rows: list[Row], cap: float | None) -> list[int]:
    """Tokens for rows without a mask or logprobs: greedy rows in one argmax, rows with the same top-k in
    one vectorised draw, others one by one."""
    chunked = Chunked(logits)
    out: dict[int, int] = {}
    greedy = [r for r, p, *_ in rows if p.greedy]
    if greedy:
        out.update(zip(greedy, chunked.argmax(torch.tensor(greedy)).tolist()))
    groups: dict[int, list] = {}
    for r, p, g, *_ in rows:
        if p.greedy:
            continue
        if 0 < p.top_k <= NUM_CHUNKS and p.top_k < logits.shape[1]:
            groups.setdefault(p.top_k, []).append((r, p, g))
        else:
            out[r] = sample(chunked.z[r], p, cap, g)
    for k, members in groups.items():
        idx = torch.tensor([r for r, _, _ in members])
        temps = torch.tensor([p.temperature for _, p, _ in members])
        top_p = torch.tensor([p.top_p for _, p, _ in members])
        toks = sample_top_k_rows(chunked, idx, k, temps, top_p, [g for _, _, g in members], cap)
        out.update(zip(idx.tolist(), toks.tolist()))
    return [out[r.slot] for r in rows]
