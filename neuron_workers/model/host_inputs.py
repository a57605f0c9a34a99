"""Host-side graph inputs: bucket choice, right padding, additive masks, the ring gather index, and the
per-step decode inputs. Pure tensor bookkeeping; no model weights here except the PLE lookup it is given.

Masks are additive with `finfo(dtype).min` (not -inf: Neuron and fully-masked padding rows stay finite).
A sliding query at position q sees keys in (q - W, q], as HF's `sliding_window_overlay`.
"""

from __future__ import annotations

import torch

from neuron_workers.errors import ContextLengthError
from neuron_workers.model.spec import GraphSpec


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


def same_block(q: torch.Tensor, k: torch.Tensor, blocks) -> torch.Tensor:
    """Whether query and key positions lie in one bidirectional block [a, b) (the 12B's image soft tokens)."""
    out = torch.zeros(torch.broadcast_shapes(q.shape, k.shape), dtype=torch.bool)
    for a, b in blocks or ():
        out |= (q >= a) & (q < b) & (k >= a) & (k < b)
    return out


def prefill_masks(n: int, bucket: int, window: int, dtype: torch.dtype, blocks=()
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal and causal+window masks [1, 1, P, P] for n real tokens right-padded to P; `blocks` [(a, b)]: on
    sliding layers the tokens of each block also see each other (window AND (causal OR block), as transformers'
    `create_masks_for_vision_model`; full layers stay causal)."""
    q = torch.arange(bucket)[:, None]
    k = torch.arange(bucket)[None, :]
    causal = (k <= q) & ((k < n) | (q >= n))
    sliding = (causal | same_block(q, k, blocks)) & (k > q - window)
    zero, neg = torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype)
    return torch.where(causal, zero, neg)[None, None], torch.where(sliding, zero, neg)[None, None]


def ring_index(n: int, ring: int) -> torch.Tensor:
    """[ring]: slot s takes the last real position p < n with p % ring == s (0 for slots never written)."""
    slots = torch.arange(ring)
    last = n - 1 - ((n - 1 - slots) % ring)
    return torch.where(last >= 0, last, 0)


PAD_ID = 0  # Gemma-4's pad token: transformers looks up the PLE rows of media soft tokens as pad


def media_values(values: dict, spec: GraphSpec, input_ids: torch.Tensor, ple_table, media) -> None:
    """Fill `mm_embeds` (when the spec has it) and `per_layer_inputs` of the rows in `values`. `media`: per row,
    None or (embeds [n, H], soft [n] bool, blocks) of its n real tokens; soft tokens' PLE rows are the pad token's,
    and a soft-token id outside an item becomes the pad token in `input_ids` too (as transformers embeds it)."""
    names = {t.name: t for t in spec.host_inputs}
    ple_ids = input_ids
    if "mm_embeds" in names:
        mm = torch.zeros(names["mm_embeds"].shape, dtype=names["mm_embeds"].dtype)
        covered = torch.zeros(input_ids.shape, dtype=torch.bool)
        for r, item in enumerate(media or ()):
            if item is not None:
                embeds, soft = item[:2]
                mm[r, :len(soft)] = embeds.to(mm.dtype)
                covered[r, :len(soft)] = soft
        loose = torch.isin(input_ids, torch.tensor(spec.media_ids, dtype=input_ids.dtype)) & ~covered
        input_ids.masked_fill_(loose, PAD_ID)  # in place: values["input_ids"] is this tensor
        ple_ids = input_ids.masked_fill(covered, PAD_ID)
        values["mm_embeds"] = mm
    elif media is not None and any(m is not None for m in media):
        raise ValueError(f"graph {spec.tag} takes no media")
    if ple_table is not None:
        values["per_layer_inputs"] = ple_table.lookup(ple_ids)


def prefill_inputs(spec: GraphSpec, ids: list[int], ple_table, window: int, slot: int, media=None
                   ) -> tuple[torch.Tensor, ...]:
    """The host inputs of a prefill graph: one prompt right-padded to the bucket, written into `slot`; `media`:
    None or (embeds [n, H], soft [n] bool, bidirectional blocks [(a, b)]) of its tokens (`media_values`)."""
    n, p = len(ids), spec.seq_len
    by_name = {t.name: t for t in spec.host_inputs}
    id_dtype, dtype = by_name["input_ids"].dtype, by_name["mask_full"].dtype
    input_ids = torch.zeros((1, p), dtype=id_dtype)
    input_ids[0, :n] = torch.tensor(ids, dtype=id_dtype)
    mask_full, mask_sliding = prefill_masks(n, p, window, dtype, media[2] if media is not None else ())
    values = {
        "input_ids": input_ids,
        "position_ids": torch.arange(p, dtype=id_dtype)[None],
        "mask_full": mask_full,
        "mask_sliding": mask_sliding,
        "last_idx": torch.tensor([n - 1], dtype=id_dtype),
        "ring_idx": ring_index(n, by_name["ring_idx"].shape[1]).to(id_dtype)[None],
        "slot": torch.tensor([slot], dtype=id_dtype),
    }
    media_values(values, spec, input_ids, ple_table, [media])
    return tuple(values[t.name] for t in spec.host_inputs)


class DecodeBatch:
    """The decode graph's host inputs for all B slots, kept between steps and updated in place (no per-step
    allocation of masks). A sliding row keeps exactly the window (q - W, q] unmasked, also when the ring holds
    more (RING_SLACK). A slot is live from `start` (after its prefill) to `free`; a free slot decodes a
    pad token at position 0 with every key masked: finite values (finfo.min, never -inf), so it never
    makes a NaN, and its KV write lands in its own slot, which the next prefill into it replaces."""

    def __init__(self, spec: GraphSpec, ple_table, window: int | None = None):
        self.spec, self.ple = spec, ple_table
        by_name = {t.name: t for t in spec.host_inputs}
        self.id_dtype, dtype = by_name["input_ids"].dtype, by_name["mask_full"].dtype
        self.neg = torch.finfo(dtype).min
        self.mask_full = torch.full(by_name["mask_full"].shape, self.neg, dtype=dtype)
        self.mask_sliding = torch.full(by_name["mask_sliding"].shape, self.neg, dtype=dtype)
        self.input_ids = torch.zeros(by_name["input_ids"].shape, dtype=self.id_dtype)
        self.position_ids = torch.zeros(by_name["position_ids"].shape, dtype=self.id_dtype)
        self.ring = self.mask_sliding.shape[-1]
        self.window = min(window or self.ring, self.ring)  # a ring may hold more than the window (RING_SLACK)
        self.names = [t.name for t in spec.host_inputs]
        # media soft-token ids (`dims.media_ids`): a generated one is fed as the pad token, as transformers embeds
        # (and looks up the PLE rows of) every soft token outside its media
        self.pad_ids = torch.zeros(0, dtype=torch.int64)  # set by the engine

    def start(self, slot: int, n: int) -> None:
        """Slot `slot` now holds a sequence whose first n positions are cached (its prefill)."""
        self.free(slot)
        self.mask_full[slot, ..., :n] = 0
        self.mask_sliding[slot, ..., torch.arange(max(0, n - self.window), n) % self.ring] = 0

    def park(self, slot: int, pos: int) -> None:
        """Slot `slot` is being prefilled in chunks: its decode row (every key masked) writes at `pos`, the
        next chunk's first position, which that chunk overwrites (its queries never read the old value)."""
        self.free(slot)
        self.position_ids[slot] = pos

    def free(self, slot: int) -> None:
        self.mask_full[slot] = self.neg
        self.mask_sliding[slot] = self.neg
        self.input_ids[slot] = 0
        self.position_ids[slot] = 0

    def inputs(self, slots: list[tuple[int, int, int]]) -> tuple[torch.Tensor, ...]:
        """Inputs to decode (slot, token, position) for each live slot; its K/V goes to slot pos / pos % ring."""
        rows = torch.tensor(slots, dtype=torch.int64).reshape(-1, 3)  # one vectorised write per input, any B
        slot, token, pos = rows.unbind(1)
        if len(self.pad_ids):
            token = torch.where(torch.isin(token, self.pad_ids), PAD_ID, token)
        if len(slots) and int(pos.max()) >= self.spec.max_context:
            raise ContextLengthError(f"position {int(pos.max())} is past the compiled context {self.spec.max_context}")
        self.mask_full[slot, 0, 0, pos] = 0
        gone = pos - self.window  # leaves the window (still in the ring when it holds more than the window)
        kept = gone >= 0
        self.mask_sliding[slot[kept], 0, 0, gone[kept] % self.ring] = self.neg
        self.mask_sliding[slot, 0, 0, pos % self.ring] = 0
        self.input_ids[slot, 0] = token.to(self.id_dtype)
        self.position_ids[slot, 0] = pos.to(self.id_dtype)
        values = {"input_ids": self.input_ids, "position_ids": self.position_ids,
                  "mask_full": self.mask_full, "mask_sliding": self.mask_sliding}
        if self.ple is not None:
            values["per_layer_inputs"] = self.ple.lookup(self.input_ids)
        return tuple(values[n] for n in self.names)
