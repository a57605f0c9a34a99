"""The MTP drafter of speculative decoding (`draft_model`): k draft steps over all slots, one token each.

A row drafts when it holds the target's last hidden state for the position before the token it feeds next
(`Sequence.hidden_at == next_position - 1`): every decode step through the top-K graph, every verify step
and every chunk step through the top-K `_h` graphs (`mixed_BxT_h` beside a chunk, `extend_1xT_h` for a prompt's
last piece alone) leaves it (`Speculation._keep_hidden`); a row fresh from a whole-prompt prefill, or whose last
step needed the full logits, decodes one step first (through the top-K graph; a step that needs the full
logits runs that graph too, first, for such rows: `Engine._ready_drafters`). The first draft reads that state,
the next ones the drafter's own (`draft_graph.DraftGraph`); all of a round's drafts run at the row's position,
over the target's KV as it is after the last step (the drafter writes none). Idle slots run with every key masked.
"""

from __future__ import annotations

import torch

from neuron_workers.model.draft_graph import draft_masks


class MtpDrafter:
    def __init__(self, backend, hidden_size: int, window: int):
        self.backend, self.window = backend, window
        self.batch, self.ctx = backend.max_batch, backend.max_context
        spec = backend.spec("decode")
        by_name = {t.name: t for t in spec.host_inputs}
        self.id_dtype, self.dtype = by_name["input_ids"].dtype, by_name["mask_full"].dtype
        self.ring = by_name["mask_sliding"].shape[-1]
        self.hidden_size = hidden_size
        self.steps = 0  # draft steps run (a bench reads it)

    @staticmethod
    def ready(seq) -> bool:
        return seq.hidden is not None and seq.hidden_at == seq.next_position - 1

    def propose_all(self, seqs: list, rooms: dict[int, int]) -> dict[int, list[int]]:
        """seq_id -> up to rooms[seq_id] drafts, for the rows of `seqs` that can draft."""
        rows = [s for s in seqs if rooms.get(s.seq_id, 0) > 0 and self.ready(s)]
        drafts: dict[int, list[int]] = {s.seq_id: [] for s in seqs}
        if not rows:
            return drafts
        ids = torch.zeros((self.batch, 1), dtype=self.id_dtype)
        hidden = torch.zeros((self.batch, 1, self.hidden_size), dtype=self.dtype)
        positions = torch.full((self.batch,), -1, dtype=torch.int64)
        for s in rows:
            ids[s.slot, 0], hidden[s.slot, 0], positions[s.slot] = s.output_ids[-1], s.hidden, s.next_position
        mask_full, mask_sliding = draft_masks(positions, self.ctx, self.ring, self.window, self.dtype)
        position_ids = positions.clamp(min=0).to(self.id_dtype)[:, None]
        for _ in range(max(rooms[s.seq_id] for s in rows)):
            ids, hidden = self.backend.draft((ids, hidden, position_ids, mask_full, mask_sliding))
            self.steps += 1
            for s in rows:
                if len(drafts[s.seq_id]) < rooms[s.seq_id]:
                    drafts[s.seq_id].append(int(ids[s.slot, 0]))
        return drafts
