"""Host inputs of the extend graph (`spec.extend_spec`, `extend_kv.ExtendKV`): R rows, each T new tokens
at positions start .. start + n - 1 of its slot (n <= T real tokens, right-padded), after what the slot
already holds at positions < start.

Masks (additive, finfo.min): a query at position q sees, in full layers, every key position <= q; in sliding
layers, ring slot s (holding the newest position p < start with p % ring == s) when q - W < p, and chunk key
j when j <= its own index and within the window. Rows the caller does not use take the other slots, with
last_idx -1 (they write nothing).
"""

from __future__ import annotations

import torch

from neuron_workers.errors import ContextLengthError
from neuron_workers.model.host_inputs import media_values, same_block
from neuron_workers.model.spec import GraphSpec


def extend_masks(start: int, t: int, ctx: int, ring: int, window: int, dtype: torch.dtype, blocks=()):
    """mask_full [1, t, ctx] and mask_sliding [1, t, ring + t] of one row whose chunk starts at `start`; `blocks`
    [(a, b)] chunk indices of bidirectional blocks, wholly in the chunk (`host_inputs.prefill_masks`)."""
    q = start + torch.arange(t)[:, None]  # [t, 1] query positions
    full = torch.arange(ctx)[None, :] <= q
    s = torch.arange(ring)
    held = start - 1 - ((start - 1 - s) % ring)  # the position ring slot s holds (negative: never written)
    ring_ok = (held[None, :] >= 0) & (held[None, :] > q - window)
    j = torch.arange(t)
    own = ((j[None, :] <= j[:, None]) | same_block(j[:, None], j[None, :], blocks)) & (j[:, None] - j[None, :] < window)
    zero, neg = torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype)
    return (torch.where(full, zero, neg)[None],
            torch.where(torch.cat([ring_ok, own], dim=1), zero, neg)[None])


def extend_inputs(spec: GraphSpec, rows: list[tuple[int, list[int], int]], ple_table, window: int, media=None
                  ) -> tuple[torch.Tensor, ...]:
    """Inputs for `rows` = [(slot, new token ids, start position)], at most spec.rows of them; `media`: per row,
    None or (embeds [n, H], soft [n] bool, bidirectional blocks [(a, b)]) of its new tokens
    (`host_inputs.media_values`)."""
    r_all, t, ctx = spec.rows, spec.seq_len, spec.max_context
    if not 1 <= len(rows) <= r_all:
        raise ValueError(f"extend {spec.tag} takes 1..{r_all} rows, got {len(rows)}")
    by_name = {x.name: x for x in spec.host_inputs}
    id_dtype, dtype = by_name["input_ids"].dtype, by_name["mask_full"].dtype
    ring = by_name["mask_sliding"].shape[-1] - t
    used = {slot for slot, _, _ in rows}
    idle = [s for s in range(spec.batch) if s not in used][: r_all - len(rows)]
    input_ids = torch.zeros((r_all, t), dtype=id_dtype)
    position_ids = torch.zeros((r_all, t), dtype=id_dtype)
    mask_full = torch.full((r_all, 1, t, ctx), torch.finfo(dtype).min, dtype=dtype)
    mask_sliding = torch.full((r_all, 1, t, ring + t), torch.finfo(dtype).min, dtype=dtype)
    last_idx = torch.full((r_all,), -1, dtype=id_dtype)
    slots = torch.tensor([s for s, _, _ in rows] + idle, dtype=id_dtype)
    for r, (_, ids, start) in enumerate(rows):
        n = len(ids)
        if not 1 <= n <= t or start + n > ctx:
            raise ContextLengthError(f"extend of {n} tokens at {start}: T is {t}, the context {ctx}")
        input_ids[r, :n] = torch.tensor(ids, dtype=id_dtype)
        position_ids[r] = torch.arange(start, start + t, dtype=id_dtype)
        blocks = media[r][2] if media is not None and media[r] is not None else ()
        mask_full[r], mask_sliding[r] = extend_masks(start, t, ctx, ring, window, dtype, blocks)
        last_idx[r] = n - 1
    values = {"input_ids": input_ids, "position_ids": position_ids, "mask_full": mask_full,
              "mask_sliding": mask_sliding, "last_idx": last_idx, "slots": slots}
    media_values(values, spec, input_ids, ple_table, media)
    return tuple(values[x.name] for x in spec.host_inputs)


def mixed_inputs(spec: GraphSpec, decode: dict[str, torch.Tensor], chunk: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, ...]:
    """Inputs of the mixed graph (`spec.mixed_spec`) from the decode step's inputs of all B slots (`decode`: name ->
    tensor, `DecodeBatch.inputs`) and one chunk row's extend inputs (`chunk`: name -> tensor, `extend_inputs` of a
    1 x T spec): the B decode tokens then the T chunk tokens on one axis; a decode row's sliding mask is its ring
    mask followed by T masked columns."""
    b, t = spec.batch, spec.seq_len
    sliding = decode["mask_sliding"]  # [B, 1, 1, ring]
    pad = torch.full((b, 1, 1, t), torch.finfo(sliding.dtype).min, dtype=sliding.dtype)
    lead = {"input_ids": decode["input_ids"].reshape(1, b), "position_ids": decode["position_ids"].reshape(1, b),
            "mask_full": decode["mask_full"].transpose(0, 2),
            "mask_sliding": torch.cat([sliding, pad], dim=3).transpose(0, 2)}
    if "per_layer_inputs" in decode:
        lead["per_layer_inputs"] = decode["per_layer_inputs"].transpose(0, 1)  # [B, 1, L, P] -> [1, B, L, P]
    axis = {"input_ids": 1, "position_ids": 1, "per_layer_inputs": 1, "mask_full": 2, "mask_sliding": 2}
    values = {name: torch.cat([lead[name], chunk[name]], dim=d) for name, d in axis.items() if name in lead}
    values["last_idx"], values["slots"] = chunk["last_idx"], chunk["slots"]
    return tuple(values[x.name] for x in spec.host_inputs)
