"""The engine's speculative decoding (`Engine` inherits it): draft, verify, accept, for the running rows.

With `speculative_method: ngram` and `num_speculative_tokens` k, a step proposes up to k prompt-lookup
drafts per row (`drafts.NgramIndex`) and, when any row has one, runs one verify step instead of a decode
step: the extend graph over all B slots with T = k + 1 (`extend_{B}x{k+1}_all`, every position's top-K
candidates), each row fed its last token and its drafts. `acceptance` keeps what the target model would
have produced. Rows the candidates cannot serve (a grammar mask, logprobs, penalties, a top-k over the candidates)
do not speculate: they decode in the same step through the decode graph, the verified rows parked at the
position their verify writes first. Positions written for rejected drafts are abandoned: full layers mask
them until they are overwritten, and a ring overwrites with them only entries at least the slack (64; the
tiny models 8) behind, which no later query reads, so k is at most the ring slack.

A step with a chunk of a prompt to prefill runs the mixed graph instead (`Prefills._mixed`: every running row
decodes one token, no row verifies that step, so the chunk's stall stays one graph); beside the MTP drafter
that is its `_h` variant, which returns the hidden state each row's next round reads, so drafting resumes the
step after (and a prompt whose last piece ran there drafts from its first step).

With `draft_model` the drafts come from the MTP drafter (`engine/mtp.py`: k draft steps over all slots
before the verify); its sliding layers read one ring entry more than the target's (W + 1 keys), so k is
at most the slack less one. Decode and verify steps then also return the target's last hidden state,
which each row keeps for its next round.
"""

from __future__ import annotations

from neuron_workers.engine.acceptance import greedy_tokens, sampled_tokens
from neuron_workers.engine.drafts import PromptLookup
from neuron_workers.engine.events import EngineEvent
from neuron_workers.engine.sampling import Sampled
from neuron_workers.engine.sequence import Sequence
from neuron_workers.engine.topk import serves
from neuron_workers.errors import UserError
from neuron_workers.model.extend_inputs import extend_inputs
from neuron_workers.model.host_inputs import PAD_ID


def check_speculative_tokens(k: int, ring: int, window: int, max_context: int, mtp: bool = False) -> None:
    """k drafts write k positions past what a row keeps: at most the ring's slack (unless the ring holds the
    whole context and never wraps); one less for the MTP drafter, which reads W + 1 ring entries. The verify
    step feeds k + 1 tokens through the extend graph, whose T is at most min(ring, context)."""
    slack = max_context if ring >= max_context else ring - window - int(mtp)
    slack = min(slack, min(ring, max_context) - 1)
    if not 0 <= k <= slack:
        raise UserError(f"num_speculative_tokens must be in [0, {slack}] (the sliding rings' slack: a rejected "
                        "draft's position must not overwrite the window)", param="num_speculative_tokens")


class Speculation:
    spec_k: int = 0  # num_speculative_tokens (0: off)
    drafter = PromptLookup()  # .propose(seq, k) -> up to k draft ids (tests put an oracle here)
    spec_draft_tokens = 0  # since the engine started: drafts verified (Prometheus: spec_decode_num_draft_tokens)
    spec_accepted_tokens = 0  # of which kept

    def _can_speculate(self, seq: Sequence) -> bool:
        k = self.backend.candidates
        return (bool(k) and seq.grammar is None and seq.logprobs is None and seq.penalties is None
                and serves(k, seq.params))

    def _room(self, seq: Sequence, ahead: int = 0) -> int:
        """Drafts `seq` may take now (`ahead`: that many steps later, each one token more)."""
        return min(self.spec_k, seq.params.max_tokens - len(seq.output_ids) - 1 - ahead,
                   self.max_context - 1 - seq.next_position - ahead)

    def _drafts(self, verify: list[Sequence]) -> dict[int, list[int]]:
        rooms = {s.seq_id: self._room(s) for s in verify}
        if hasattr(self.drafter, "propose_all"):  # the MTP drafter: one batched draft step per token
            return self.drafter.propose_all(verify, rooms)
        return {s.seq_id: list(self.drafter.propose(s, rooms[s.seq_id]))[:rooms[s.seq_id]]
                if rooms[s.seq_id] > 0 else [] for s in verify}

    @staticmethod
    def _keep_hidden(seq: Sequence, hidden, position: int) -> None:
        """The target's hidden state at `position` (where the row's next token came from), for the drafter."""
        if hidden is not None:
            seq.hidden, seq.hidden_at = hidden.clone(), position

    def _speculate(self, running: list[Sequence]) -> list[EngineEvent]:
        """One step for `running`: a verify step for the rows that speculate, a decode step for the others."""
        verify = [s for s in running if self._can_speculate(s)]
        drafts = self._drafts(verify)
        if not any(drafts.values()):
            return self._decode(running)
        plain = [s for s in running if s.seq_id not in drafts]
        events: list[EngineEvent] = []
        if plain:
            for s in verify:  # their decode rows write where the verify writes first
                self.batch.park(s.slot, s.next_position)
            events += self._decode(plain)
        try:
            spec = self.backend.extend_spec(self.spec_k + 1, self.max_batch, per_position=True)
            inputs = extend_inputs(spec, [(s.slot, self._as_fed([s.output_ids[-1]] + drafts[s.seq_id]),
                                           s.next_position) for s in verify], self.model.ple, self.dims.sliding_window)
            cands = self.backend.extend(spec, inputs)
        except Exception as e:  # the backend failed: these sequences end, the engine goes on
            return events + [self._fail(s, e) for s in verify]
        for i, s in enumerate(verify):
            out = self._guard(s, lambda s, i=i: self._accept(s, cands, i, drafts[s.seq_id]))
            events += out if isinstance(out, list) else [out]
        return events

    def _as_fed(self, ids: list[int]) -> list[int]:
        """Tokens as the verify graph takes them: a media soft token the model generated (or a draft proposes) is
        fed as the pad token, as decode feeds it (`DecodeBatch.pad_ids`) and transformers embeds it."""
        return [PAD_ID if t in self.soft_ids else t for t in ids] if self.soft_ids else ids

    def _accept(self, seq: Sequence, cands, row: int, drafts: list[int]) -> list[EngineEvent]:
        cap = self.dims.final_logit_softcapping
        if seq.params.greedy:
            tokens = greedy_tokens(cands, row, drafts)
        else:
            tokens = sampled_tokens(cands, row, drafts, seq.params, cap, seq.generator)
        self.spec_draft_tokens += len(drafts)
        self.spec_accepted_tokens += len(tokens) - 1
        seq.reach = max(seq.reach, seq.next_position + 1 + len(drafts))
        n = len(tokens) - 1  # drafts kept: the next token came from the verify's position n
        self._keep_hidden(seq, None if cands.hidden is None else cands.hidden[row, n], seq.next_position + n)
        events = []
        for t in tokens:
            ev = self._emit(seq, Sampled(t))
            events.append(ev)
            if ev.final:
                return events
        self.batch.start(seq.slot, seq.next_position)
        return events
