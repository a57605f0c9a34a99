"""Rows that need the whole distribution: a grammar's token mask, logprobs, or penalties and a logit bias. They
pay for the full vocabulary alone; rows beside them take the vectorised path in `sampling.sample_rows`.

Logprobs are the log-softmax of the soft-capped fp32 logits: the model's distribution before temperature,
top-k, top-p and any grammar mask (vLLM's default). A mask removes tokens after the soft-cap (a capped
logit is finite, so masking before it would leave masked tokens a probability); greedy rows take the
argmax of the masked raw logits (the cap is monotone, and raw values have no cap-made ties). Penalties
(`penalties.Penalties`) change the capped values before all of that; the row is then sampled from those, and
its logprobs stay the model's.
"""

from __future__ import annotations

import numpy as np
import torch

from neuron_workers.engine.rows import Row, Sampled, soft_cap

_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [ceil(vocab / 32)] (bit j of word i: token 32 i + j allowed) -> bool [vocab]."""
    return ((bitmask.reshape(-1, 1) >> _BITS) & 1).bool().reshape(-1)[:vocab]


SPARSE_WORDS = 512  # masks with at most this many non-zero words are sampled over their allowed ids only
CHUNKS = 1024  # top-k over 262,144 values: the k chunks with the largest maxima hold the top k


def allowed_ids(bitmask: torch.Tensor, vocab: int, limit: int = SPARSE_WORDS) -> torch.Tensor | None:
    """The allowed token ids, ascending, when the mask is sparse (at most `limit` non-zero words); else None."""
    words = torch.nonzero(bitmask).flatten()
    if words.numel() > limit:
        return None
    bits = ((bitmask[words].unsqueeze(1) >> _BITS) & 1).bool()
    ids = (words.unsqueeze(1) * 32 + _BITS)[bits]
    return ids[ids < vocab]


def sample_full_row(logits: torch.Tensor, row: Row, cap: float | None) -> Sampled:
    """One row's token (and logprobs when asked) from its raw logits [vocab]. A mask removes tokens from the
    distribution the row's own sampling parameters shape; a sparse mask is sampled over its allowed ids
    alone, a dense one over the whole row with masked values at -inf (the same distribution either way)."""
    p, raw = row.params, None
    if row.penalty is not None and row.allowed is None and (p.greedy or 0 < p.top_k <= CHUNKS):
        token = _penalized(logits, row, cap)  # no copy of the row but the sequence's buffer (`Penalties.untouched`)
    else:
        raw = logits.float()
        token = _token(raw, row, cap)
        if token < 0:
            return Sampled(-1, error="the grammar allows no next token")
    if row.logprobs is None:
        return Sampled(token)
    lp = torch.log_softmax(soft_cap(logits.float() if raw is None else raw, cap), dim=-1)
    top = torch.topk(lp, row.logprobs) if row.logprobs else None
    pairs = tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ()
    return Sampled(token, float(lp[token]), pairs)


def _token(raw: torch.Tensor, row: Row, cap: float | None) -> int:
    """The token of a row that reads its whole distribution (raw: fp32 [vocab]); -1: its grammar allows none."""
    p = row.params
    z, zcap = (raw, cap) if row.penalty is None else (row.penalty.apply(soft_cap(raw, cap)), None)
    if row.allowed is None:
        return _argmax(z) if p.greedy else _draw(soft_cap(z, zcap), p, row.generator)
    return _masked(z, row, zcap)


def penalized_candidates(logits: torch.Tensor, pen, k: int, cap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) holding the top k of a penalized row's capped logits without capping the vocabulary: the
    penalties change only their touched ids (`Penalties.ids`), so the best k untouched raw values (the cap is
    monotone; k = 1: the first best id, as argmax), capped, and the touched ids' penalized values hold them.
    -inf: fewer than k untouched ids."""
    rest = pen.untouched(logits)
    if k == 1:
        best = _argmax(rest)
        vals, idx = rest[best:best + 1].clone(), torch.tensor([best])
    else:
        vals, idx = _top_k(rest, min(k, rest.numel()))
    capped = soft_cap(vals, cap).masked_fill(torch.isinf(vals), float("-inf"))
    return torch.cat([capped, pen.values(soft_cap(logits[pen.ids], cap))]), torch.cat([idx, pen.ids])


def _penalized(logits: torch.Tensor, row: Row, cap: float | None) -> int:
    """A greedy or top-k row's token under its penalties (`penalized_candidates`); greedy takes the lowest id
    among equal best values."""
    p = row.params
    z, ids = penalized_candidates(logits, row.penalty, 1 if p.greedy else p.top_k, cap)
    if p.greedy:
        return int(ids[z == z.max()].min())
    return int(ids[_draw(z, p, row.generator)])


def _argmax(z: torch.Tensor) -> int:
    return int(z.numpy().argmax())  # first index on ties, as torch.argmax (which is slower on CPU)


def _masked(raw: torch.Tensor, row: Row, cap: float | None) -> int:
    """The row's token under its mask (raw: fp32 [vocab]; capped already when cap is None), or -1 when the mask
    allows nothing."""
    p, mask, vocab = row.params, row.allowed, raw.shape[-1]
    ids = allowed_ids(mask, vocab)
    if ids is not None:  # sparse: only the allowed ids
        if not ids.numel():
            return -1
        sub = raw.index_select(0, ids)
        return int(ids[_argmax(sub)] if p.greedy else ids[_draw(soft_cap(sub, cap), p, row.generator)])
    a = raw.numpy()
    if p.greedy:
        token = int(a.argmax())
        if (int(mask[token >> 5]) >> (token & 31)) & 1:
            return token
    ok = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:vocab].view(bool)
    if not ok.any():
        return -1
    masked = np.full_like(a, -np.inf)
    np.copyto(masked, a, where=ok)
    if p.greedy:
        return int(masked.argmax())
    z = torch.from_numpy(masked)
    if 0 < p.top_k < vocab:  # top-k of the masked raw values, then the cap (monotone) on those alone
        vals, idx = _top_k(z, p.top_k)
        capped = soft_cap(vals, cap).masked_fill(torch.isinf(vals), float("-inf"))
        return int(idx[_draw(capped, p, row.generator)])
    return _draw(soft_cap(raw, cap).masked_fill(torch.from_numpy(~ok), float("-inf")), p, row.generator)


def _top_k(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(z, k) for z [vocab]: the top k lie in the k chunks with the largest maxima."""
    if z.numel() % CHUNKS or k > CHUNKS:
        return torch.topk(z, k)
    rows = z.view(CHUNKS, -1)
    width = rows.shape[1]
    best = rows.amax(dim=1).topk(k).indices
    vals, j = rows.index_select(0, best).flatten().topk(k)
    return vals, best[j // width] * width + j % width


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
