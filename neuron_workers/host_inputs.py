"""Host-side graph inputs: bucket choice, right padding, additive masks, the ring gather index, and the
per-step decode inputs. Pure tensor bookkeeping; no model weights here except the PLE lookup it is given.

Masks are additive with `finfo(dtype).min` (not -inf: Neuron and fully-masked padding rows stay finite).
A sliding query at position q sees keys in (q - W, q], as HF's `sliding_window_overlay`.
"""

from __future__ import annotations

import torch

from neuron_workers.errors import ContextLengthError
from neuron_workers.spec import GraphSpec


def default_buckets(max_context: int, smallest: int = 32) -> tuple[int, ...]:
    """Powers of two from `smallest` up to max_context, plus max_context itself."""
    out, b = [], smallest
    while b < max_context:
        out.append(b)
        b *= 2
    return tuple(out) + (max_context,)


def choose_bucket(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds n prompt tokens."""
    for b in sorted(buckets):
        if n <= b:
            return b
    raise ContextLengthError(f"prompt has {n} tokens; the largest prefill bucket holds {max(buckets)}")


def prefill_masks(n: int, bucket: int, window: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal and causal+window masks [1, 1, P, P] for n real tokens right-padded to P."""
    q = torch.arange(bucket)[:, None]
    k = torch.arange(bucket)[None, :]
    causal = (k <= q) & ((k < n) | (q >= n))
    sliding = causal & (k > q - window)
    zero, neg = torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype)
    return torch.where(causal, zero, neg)[None, None], torch.where(sliding, zero, neg)[None, None]


def ring_index(n: int, ring: int) -> torch.Tensor:
    """[ring]: slot s takes the last real position p < n with p % ring == s (0 for slots never written)."""
    slots = torch.arange(ring)
    last = n - 1 - ((n - 1 - slots) % ring)
    return torch.where(last >= 0, last, 0)


def prefill_inputs(spec: GraphSpec, ids: list[int], ple_table, window: int) -> tuple[torch.Tensor, ...]:
    """The non-KV inputs of a batch-1 prefill graph, in `spec` order."""
    n, p = len(ids), spec.seq_len
    id_dtype = spec.inputs[0].dtype
    dtype = next(t.dtype for t in spec.inputs if t.name == "mask_full")
    input_ids = torch.full((1, p), 0, dtype=id_dtype)
    input_ids[0, :n] = torch.tensor(ids, dtype=id_dtype)
    mask_full, mask_sliding = prefill_masks(n, p, window, dtype)
    values = {
        "input_ids": input_ids,
        "position_ids": torch.arange(p, dtype=id_dtype)[None],
        "mask_full": mask_full,
        "mask_sliding": mask_sliding,
        "last_idx": torch.tensor([n - 1], dtype=id_dtype),
        "ring_idx": ring_index(n, _ring(spec)).to(id_dtype)[None],
    }
    if ple_table is not None:
        values["per_layer_inputs"] = ple_table.lookup(input_ids)
    return tuple(values[t.name] for t in spec.inputs[: len(spec.inputs) - spec.num_kv])


def _ring(spec: GraphSpec) -> int:
    return next(t.shape[1] for t in spec.inputs if t.name == "ring_idx")


class DecodeInputs:
    """Per-sequence decode inputs, updated in place each step (no per-step allocation of masks)."""

    def __init__(self, spec: GraphSpec, ple_table):
        self.spec, self.ple = spec, ple_table
        by_name = {t.name: t for t in spec.inputs}
        self.id_dtype = by_name["input_ids"].dtype
        neg = torch.finfo(by_name["mask_full"].dtype).min
        self.mask_full = torch.full(by_name["mask_full"].shape, neg, dtype=by_name["mask_full"].dtype)
        self.mask_sliding = torch.full(by_name["mask_sliding"].shape, neg, dtype=by_name["mask_sliding"].dtype)
        self.ring = self.mask_sliding.shape[-1]
        self.names = [t.name for t in spec.inputs[: len(spec.inputs) - spec.num_kv]]

    def start(self, n: int) -> None:
        """After a prefill of n tokens: positions [0, n) are cached."""
        self.mask_full.fill_(torch.finfo(self.mask_full.dtype).min)
        self.mask_sliding.fill_(torch.finfo(self.mask_sliding.dtype).min)
        self.mask_full[..., :n] = 0
        self.mask_sliding[..., : min(n, self.ring)] = 0

    def step(self, token: int, pos: int) -> tuple[torch.Tensor, ...]:
        """Inputs to decode `token` at position `pos` (its K/V goes to slot pos / pos % ring)."""
        if pos >= self.spec.max_context:
            raise ContextLengthError(f"position {pos} is past the compiled context {self.spec.max_context}")
        self.mask_full[..., pos] = 0
        self.mask_sliding[..., pos % self.ring] = 0
        ids = torch.tensor([[token]], dtype=self.id_dtype)
        values = {"input_ids": ids, "position_ids": torch.tensor([[pos]], dtype=self.id_dtype),
                  "mask_full": self.mask_full, "mask_sliding": self.mask_sliding}
        if self.ple is not None:
            values["per_layer_inputs"] = self.ple.lookup(ids)
        return tuple(values[n] for n in self.names)
