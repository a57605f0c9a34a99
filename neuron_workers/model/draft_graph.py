"""The MTP draft step as a static-shape graph over all B slots (`assistant.Assistant` + the target's KV).

One call drafts one token per row. A row's input is the token at its position q (embedded by the *target's*
scaled embedding) beside a hidden state: the target's last hidden state (after its final norm) at q - 1 for
the first draft of a round, then the drafter's own projected state. Every draft of a round runs at the same
position q, as transformers' `Gemma4AssistantCandidateGenerator` does. The assistant's layers compute no K/V:
each reads the K/V buffers of the target's last sliding and last full KV layer (`assistant.store_layers`),
read-only, through HF's `shared_kv_states`. The draft is the argmax of the assistant's head: the tied LM head,
or with `use_ordered_embeddings` only the tokens of the `centroid_top_k` best centroids. In a graph (`topk_op` set:
the graph model's, the SDK's TopK in a Neuron build) the whole head's argmax is the tiled top-1
(`tiled_topk`: fp32 tiles of at most 8,192, as the decode graphs' top-K), not one reduce over 262,144.

  inputs:  input_ids [B, 1], hidden [B, 1, H_target], position_ids [B, 1], mask_full [B, 1, 1, ctx],
           mask_sliding [B, 1, 1, ring], then k/v of the full store layer and k/v of the sliding one
  outputs: draft_ids [B, 1] (the id dtype), next_hidden [B, 1, H_target]

Masks (`draft_masks`): the keys of positions < q in full layers; in sliding layers the last W + 1 of them
(transformers' bidirectional sliding mask: distance <= W), so a ring must hold W + 1 + k - 1 positions
behind the newest written one (speculate.check_speculative_tokens).
"""

from __future__ import annotations

import torch
from torch import nn

from neuron_workers.model.dims import FULL, SLIDING


class DraftGraph(nn.Module):
    """`topk_op`: None, torch.topk picks the centroids; else `tiled_topk` with that per-tile op (the graph
    model sets it: the Neuron build's is the SDK's TopK)."""

    def __init__(self, assistant: nn.Module, target_embed: nn.Module, id_dtype: torch.dtype = torch.int64):
        super().__init__()
        self.assistant, self.embed = assistant, target_embed
        self.id_dtype = id_dtype
        self.layer_types = tuple(assistant.model.config.layer_types)
        self.topk_op = None

    def forward(self, input_ids, hidden, position_ids, mask_full, mask_sliding, k_full, v_full, k_sliding, v_sliding):
        h = self.normed(input_ids, hidden, position_ids, mask_full, mask_sliding, k_full, v_full, k_sliding,
                        v_sliding)
        return self._argmax(h[:, 0, :]).to(self.id_dtype)[:, None], self.assistant.post_projection(h)

    def normed(self, input_ids, hidden, position_ids, mask_full, mask_sliding, k_full, v_full, k_sliding, v_sliding):
        """The assistant's last hidden state after its final norm [B, 1, H_assistant]."""
        a, m = self.assistant, self.assistant.model
        h = a.pre_projection(torch.cat([self.embed(input_ids), hidden.to(self.embed.weight.dtype)], dim=-1))
        rope = {t: m.rotary_emb(h, position_ids, t) for t in set(self.layer_types)}
        shared = {FULL: (k_full, v_full), SLIDING: (k_sliding, v_sliding)}
        masks = {FULL: mask_full, SLIDING: mask_sliding}
        for layer, t in zip(m.layers, self.layer_types):
            h = layer(h, shared_kv_states=shared, position_embeddings=rope[t], attention_mask=masks[t],
                      position_ids=position_ids)
        return m.norm(h)

    @torch.no_grad()
    def margins(self, *inputs) -> torch.Tensor:
        """Each row's gap between the head's two best logits [B] (`forward`'s inputs): how clear its draft is
        (the smoke test compares drafts only where it is clear)."""
        _, logits = self._scores(self.normed(*inputs)[:, 0, :])
        top2 = torch.topk(logits.float(), 2, dim=-1).values
        return top2[:, 0] - top2[:, 1]

    def _scores(self, h: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """[rows, H] -> (the candidate token ids [rows, N], None for the whole vocabulary; their logits)."""
        weight = self.assistant.lm_head_weight
        head = self.assistant.masked_embedding
        if head is None:
            return None, nn.functional.linear(h, weight)
        ids = head.candidates(h, self.topk_op)  # [rows, N]
        return ids, torch.einsum("rh,rnh->rn", h, weight[ids])

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        """[rows, H] -> each row's best token id."""
        ids, logits = self._scores(h)
        if ids is None:  # the whole vocabulary: in a graph, through the tiled top-K (no 262,144-wide reduce)
            if self.topk_op is None:
                return torch.argmax(logits, dim=-1)
            from neuron_workers.model.tiled_topk import tiled_topk

            return tiled_topk(logits, 1, self.topk_op)[1][:, 0]
        return torch.gather(ids, 1, torch.argmax(logits, dim=-1, keepdim=True))[:, 0]


def draft_masks(positions: torch.Tensor, ctx: int, ring: int, window: int, dtype: torch.dtype):
    """mask_full [B, 1, 1, ctx] and mask_sliding [B, 1, 1, ring] for rows drafting at `positions` [B]
    (a negative position: an idle row, every key masked)."""
    q = positions.to(torch.int64)[:, None]
    full = (torch.arange(ctx)[None, :] < q)
    s = torch.arange(ring)[None, :]
    held = (q - 1) - ((q - 1 - s) % ring)  # the newest position < q that ring slot s holds
    sliding = (held >= 0) & (held >= q - 1 - window) & (q > 0)
    zero, neg = torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype)
    return torch.where(full, zero, neg)[:, None, None], torch.where(sliding, zero, neg)[:, None, None]
