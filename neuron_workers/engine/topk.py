"""Argmax and top-k of a decode step's rows without an fp32 copy of the vocabulary: the two views the
sampler reads (`sampling._plain_tokens`), with the same answers whichever the step used.

- `Chunked`: full logits [B, vocab] as the graph returned them (bf16 on inf2). Each row is cut into 1024
  chunks; the chunk maxima come from the raw bf16 bits viewed as int16 (a bf16 orders like its int16
  pattern when positive and reversed when negative, so a chunk's largest value is the pattern of its
  int16 max if that is >= 0, else of its int16 min). That scan reads 2 bytes a logit with integer
  instructions, about 10x faster than `logits.float()`. Only the best chunks are then converted to fp32
  (exact: bf16 -> fp32 loses nothing), so the answers equal `torch.argmax` / `torch.topk` on the fp32 copy.
- `TopCandidates`: the K best logits and ids per row that the `decode` graph (top-K variant) returns; the host
  touches K values a row, never the vocabulary.

Ties: argmax returns the first index (torch.argmax); top-k lists its values best first with equal values
in increasing token id, and when values tie at the k-th place the lowest ids are kept. Both views look at
`k + MARGIN` candidates to settle that order, so a row samples the same token from either view (exactly,
unless more than MARGIN logits tie at its k-th value).
"""

from __future__ import annotations

import torch

from neuron_workers.model.spec import Candidates

NUM_CHUNKS = 1024  # 262,144-wide logits as 1024 chunks of 256: chunk maxima first, then inside the best
MARGIN = 64  # candidates beyond k kept to settle ties at the k-th place


def canonical(values: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of (values, ids) [n, m] ordered by value, best first, equal values by increasing id."""
    by_id = ids.argsort(dim=1)
    values, ids = values.gather(1, by_id), ids.gather(1, by_id)
    order = values.sort(dim=1, descending=True, stable=True).indices[:, :k]
    return values.gather(1, order), ids.gather(1, order)


def _bf16_chunk_maxima(rows: torch.Tensor) -> torch.Tensor:
    """rows [B, C, W] bf16 -> [B, C] fp32 chunk maxima, from integer max / min over the int16 patterns."""
    bits = rows.view(torch.int16)
    hi, lo = bits.amax(dim=2), bits.amin(dim=2)
    return torch.where(hi >= 0, hi, lo).view(torch.bfloat16).float()


class Chunked:
    """Full logits [B, vocab] viewed as B x 1024 chunks, with every chunk's maximum computed once per step
    and shared by the greedy and the top-k rows. Rows that need the whole distribution get `row(r)`."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        b, vocab = logits.shape
        self.ok = vocab % NUM_CHUNKS == 0 and vocab >= NUM_CHUNKS and logits.is_contiguous()
        if not self.ok:  # a small vocabulary: the fp32 copy costs little
            self.z = logits.float()
            return
        self.rows = logits.view(b, NUM_CHUNKS, -1)
        self._maxima: torch.Tensor | None = None

    @property
    def maxima(self) -> torch.Tensor:  # [B, 1024] fp32
        if self._maxima is None:
            rows = self.rows
            self._maxima = _bf16_chunk_maxima(rows) if rows.dtype == torch.bfloat16 else rows.amax(dim=2).float()
        return self._maxima

    def row(self, r: int) -> torch.Tensor:
        """Row r in fp32: the full-distribution rows pay for their own copy."""
        return self.logits[r].float()

    def argmax(self, idx: torch.Tensor) -> torch.Tensor:
        """torch.argmax(z[idx], dim=1), first index on ties: the first winning chunk, then argmax inside it."""
        if not self.ok:
            return self.z.index_select(0, idx).argmax(dim=1)
        r = self.maxima.index_select(0, idx).argmax(dim=1)
        return r * self.rows.shape[2] + self.rows[idx, r].float().argmax(dim=1)

    def topk(self, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """torch.topk(z[idx], k, dim=1) in fp32, in the canonical order: a row's top k + MARGIN lie in its
        k + MARGIN chunks with the largest maxima."""
        m = min(k + MARGIN, self.logits.shape[1])
        if not self.ok or m > NUM_CHUNKS:
            z = self.z if not self.ok else self.logits
            vals, ids = z.index_select(0, idx).float().topk(m, dim=1)
            return canonical(vals, ids, k)
        width = self.rows.shape[2]
        best = self.maxima.index_select(0, idx).topk(m, dim=1).indices  # [n, m] chunk ids
        cand = self.rows[idx[:, None], best].reshape(len(idx), m * width).float()
        vals, i = cand.topk(m, dim=1)
        return canonical(vals, best.gather(1, i // width) * width + i % width, k)


class TopCandidates:
    """The `decode` graph's outputs: rows whose top-k fits in K - MARGIN (and greedy rows) read only these."""

    def __init__(self, cands: Candidates):
        self.values, self.ids = cands.values, cands.ids.long()
        self.k = self.values.shape[1]

    def row(self, r: int) -> torch.Tensor:
        raise RuntimeError("this step returned top-K candidates, not logits: the engine must ask the backend "
                           "for the logits when a row needs the whole distribution")

    def argmax(self, idx: torch.Tensor) -> torch.Tensor:
        v, ids = self.values.index_select(0, idx), self.ids.index_select(0, idx)
        best = v.amax(dim=1, keepdim=True)
        return ids.masked_fill(v != best, torch.iinfo(torch.int64).max).amin(dim=1)

    def topk(self, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return canonical(self.values.index_select(0, idx).float(), self.ids.index_select(0, idx), k)


def serves(k_compiled: int, params) -> bool:
    """Whether a plain row (no mask, no logprobs) with these params can be sampled from K candidates."""
    return params.greedy or 0 < params.top_k <= k_compiled - MARGIN
