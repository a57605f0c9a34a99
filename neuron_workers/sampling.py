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


def batched_argmax(z: torch.Tensor) -> torch.Tensor:
    """torch.argmax(z, dim=1) for z [n, vocab] (first index on ties): row maxima of 256-wide chunks first,
    then argmax within the winning chunk, without converting the logits to fp32."""
    n, vocab = z.shape
    if vocab % CHUNK_ROWS:
        return torch.argmax(z, dim=1)
    rows = z.view(n, CHUNK_ROWS, -1)
    r = rows.amax(dim=2).argmax(dim=1)
    within = rows[torch.arange(n), r].argmax(dim=1)
    return r * rows.shape[2] + within


def batched_topk(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(z, k, dim=1) for z [n, vocab]: the top k of a row lie in its k chunks with the largest maxima."""
    n, vocab = z.shape
    if vocab % CHUNK_ROWS or k > CHUNK_ROWS:
        return torch.topk(z, k, dim=1)
    rows = z.view(n, CHUNK_ROWS, -1)
    width = rows.shape[2]
    best = rows.amax(dim=2).topk(k, dim=1).indices  # [n, k] chunk ids
    cand = rows.gather(1, best[:, :, None].expand(n, k, width)).reshape(n, k * width)
    vals, i = cand.topk(k, dim=1)
    return vals, best.gather(1, i // width) * width + i % width


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


def sample_top_k_rows(z: torch.Tensor, k: int, temperature: torch.Tensor, top_p: torch.Tensor,
                      generators: list, cap: float | None) -> torch.Tensor:
    """One token per row of z [n, vocab] (raw logits), all rows with the same top-k, each with its own
    temperature, top-p and generator."""
    vals, idx = batched_topk(z, k)  # the cap is monotone: same top k before and after
    probs = torch.softmax(soft_cap(vals, cap) / temperature[:, None], dim=-1)
    cdf = torch.cumsum(probs, -1)
    probs = torch.where(cdf - probs < top_p[:, None], probs, 0.0)  # nucleus: always keeps the top token
    cdf = torch.cumsum(probs, -1)
    u = torch.stack([torch.rand((), generator=g) for g in generators]) * cdf[:, -1]
    choice = torch.searchsorted(cdf, u[:, None], right=True).clamp_(max=k - 1)
    return idx.gather(1, choice)[:, 0]


def sample_rows(logits: torch.Tensor, rows: list[tuple[int, SamplingParams, torch.Generator | None]],
                cap: float | None) -> list[int]:
    """A token for each (row, params, generator) from logits [B, vocab]; returned in the order of `rows`."""
    out: dict[int, int] = {}
    greedy = [r for r, p, _ in rows if p.greedy]
    if greedy:
        idx = torch.tensor(greedy)
        out.update(zip(greedy, batched_argmax(logits.index_select(0, idx)).tolist()))
    groups: dict[int, list] = {}
    for r, p, g in rows:
        if p.greedy:
            continue
        if 0 < p.top_k <= CHUNK_ROWS and p.top_k < logits.shape[1]:
            groups.setdefault(p.top_k, []).append((r, p, g))
        else:
            out[r] = sample(logits[r], p, cap, g)
    for k, members in groups.items():
        idx = torch.tensor([r for r, _, _ in members])
        temps = torch.tensor([p.temperature for _, p, _ in members])
        top_p = torch.tensor([p.top_p for _, p, _ in members])
        toks = sample_top_k_rows(logits.index_select(0, idx), k, temps, top_p, [g for _, _, g in members], cap)
        out.update(zip(idx.tolist(), toks.tolist()))
    return [out[r] for r, _, _ in rows]
