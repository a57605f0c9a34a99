"""The engine's prefill side (`Engine` inherits it): a whole prompt through a prefill bucket, or the next
tokens of a prompt through the extend graph (a chunk of chunked prefill, or the rest of a prompt whose prefix
its slot already held), and what a slot keeps when its sequence ends (prefix reuse). While other rows decode,
such a piece runs in the mixed graph with their decode tokens (`_mixed`: one graph, so a chunk step costs
about one decode step; beside an MTP drafter its `_h` variant, which returns the hidden states the rows' next
round of drafts reads). A piece that holds media soft tokens carries their embeddings (`Sequence.media_rows`: the
graphs' `mm_embeds`, and the 12B's bidirectional image blocks in its masks) and runs through the prefill or extend
graph, never the mixed one. Needs the engine's `backend`, `model`, `dims`, `batch`, `scheduler`, `prefix`,
`extend_t`, `mixed_steps` and its sampling helpers."""

from __future__ import annotations

import dataclasses
import logging

import torch

from neuron_workers.engine.events import EngineEvent, TokenEvent
from neuron_workers.engine.sampling import Row, needs_logits, soft_cap
from neuron_workers.engine.sequence import Sequence
from neuron_workers.model.extend_inputs import extend_inputs, mixed_inputs
from neuron_workers.model.host_inputs import choose_bucket, prefill_inputs
from neuron_workers.model.spec import PREFILL

log = logging.getLogger(__name__)


class Prefills:
    def _prefill_work(self, seq: Sequence, n: int) -> TokenEvent | None:
        """Prefill `n` more prompt tokens of `seq` (from `seq.prefilled`): the first token's event once the
        prompt is done, else None."""
        if self._by_prefill_graph(seq, n):
            return self._prefill(seq, n)
        return self._extend(seq, n)

    def _by_prefill_graph(self, seq: Sequence, n: int) -> bool:
        """A piece from position 0 goes through a prefill bucket: a whole prompt, or (chunking off) the prompt
        up to a point whose sliding window is kept (`Scheduler._piece`)."""
        return seq.prefilled == 0 and (n == len(seq.prompt_ids) or not self.prefill_chunk) \
            and seq.prompt_logprobs is None

    def _prefill(self, seq: Sequence, n: int) -> TokenEvent | None:
        ids = seq.feed[:n]
        bucket = choose_bucket(n, self.backend.buckets)
        spec = self.backend.spec(PREFILL, bucket)
        inputs = prefill_inputs(spec, ids, self.model.ple, self.dims.sliding_window, seq.slot, seq.media_rows(0, n))
        logits = self.backend.prefill(bucket, inputs)
        self._prefilled(seq, n)
        if n < len(seq.prompt_ids):
            self.batch.park(seq.slot, n)
            return None
        self.batch.start(seq.slot, n)
        return self._emit(seq, self._sample(logits, [(0, seq)])[0])

    def _prefilled(self, seq: Sequence, n: int) -> None:
        """`n` more prompt tokens of `seq` are in its slot: keep the sliding windows of the points the rings
        hold now and will not after the next piece (every point from the last piece on, up to the slack)."""
        self.scheduler.prefilled(seq, n)
        windows = self.prefix.windows if self.prefix is not None else None
        if windows is None:
            return
        end, slack = seq.prefilled, self.batch.ring - self.batch.window
        for p in seq.keep_points:
            if max(seq.reused + 1, end - slack) <= p <= end and not windows.holds(seq.slot, p):
                self.backend.save_window(seq.slot, windows.claim(seq.slot, p), p - self.batch.window)

    def _restore(self, seq: Sequence) -> None:
        """Before `seq`'s first piece: the slot it reuses is cloned into its own, then the kept window it was
        admitted with goes back into its rings."""
        (src, entry), seq.restore = seq.restore, None
        if src is not None:
            self.backend.clone_slot(src, seq.slot, seq.reused)
        if entry is not None:
            self.backend.restore_window(seq.slot, entry, seq.reused - self.batch.window)

    def _extend(self, seq: Sequence, n: int) -> TokenEvent | None:
        """The next `n` prompt tokens of `seq` through the extend graph (T = extend_t, one row); the last
        piece samples the first token, the others leave the slot parked (its decode row writes only where the
        next piece writes)."""
        start = seq.prefilled
        last = start + n == len(seq.prompt_ids)
        rows = self._rows([(0, seq)]) if last else []
        k = self.backend.candidates
        scored = seq.prompt_logprobs is not None
        logits = not k or scored or any(needs_logits(r, k) for r in rows if isinstance(r, Row))
        spec = self.backend.extend_spec(self.extend_t, 1, logits=logits, per_position=scored)
        inputs = extend_inputs(spec, [(seq.slot, seq.feed[start:start + n], start)], self.model.ple,
                               self.dims.sliding_window, [seq.media_rows(start, n)])
        scores = self.backend.extend(spec, inputs)
        if scored:  # every position's logits [1, T, vocab]: the prompt's logprobs, then the last one's row
            self._score(seq, scores[0, :n], start)
            scores = scores[:, n - 1]
        self._prefilled(seq, n)
        if not last:
            self.batch.park(seq.slot, seq.prefilled)
            return None
        self.batch.start(seq.slot, len(seq.prompt_ids))
        self._keep_hiddens(scores, [(0, seq)])
        ev = self._emit(seq, self._pick(scores, rows)[0])
        return dataclasses.replace(ev, prompt_logprobs=(None, *seq.prompt_lp)) if scored else ev

    def _score(self, seq: Sequence, logits, start: int) -> None:
        """The logprobs of the prompt tokens after positions start .. start + T - 1 (T rows of logits) on the
        soft-capped fp32 values, as for sampled tokens (`distribution.sample_full_row`), the top n there and the
        token's rank (1: the most likely)."""
        ids = seq.prompt_ids[start + 1:start + 1 + len(logits)]
        lp = torch.log_softmax(soft_cap(logits[:len(ids)].float(), self.dims.final_logit_softcapping), dim=-1)
        n = seq.prompt_logprobs
        top = torch.topk(lp, n, dim=-1) if n else None
        chosen = lp.gather(1, torch.tensor(ids)[:, None])
        ranks = (lp > chosen).sum(dim=1).add_(1).tolist()
        for j, value in enumerate(chosen[:, 0].tolist()):
            pairs = tuple(zip(top.indices[j].tolist(), top.values[j].tolist())) if top is not None else ()
            seq.prompt_lp.append((value, pairs, ranks[j]))

    def _mixable(self, work: list[tuple[Sequence, int]], decoding: int) -> int | None:
        """Which piece of this step's prefill work runs in the mixed graph with the decode rows (its index in
        `work`): the first one through the extend graph without media, when rows decode and the backend has the
        graph."""
        if not (self.mixed_steps and decoding):
            return None
        return next((i for i, (seq, n) in enumerate(work) if not self._by_prefill_graph(seq, n)
                     and seq.prompt_logprobs is None and seq.media_rows(seq.prefilled, n) is None), None)

    def _mixed(self, seq: Sequence, n: int, running: list[Sequence]) -> list[EngineEvent]:
        """The next `n` prompt tokens of `seq` and one decode token of every row of `running`, in one mixed
        graph (`spec.mixed_spec`); the events of the decode rows, and `seq`'s first token if its prompt is done."""
        last = seq.prefilled + n == len(seq.prompt_ids)
        rows = self._rows([(s.slot, s) for s in running] + ([(self.max_batch, seq)] if last else []))
        k = self.backend.candidates
        spec = self.backend.mixed_spec(self.extend_t, logits=not k or any(needs_logits(r, k) for r in rows
                                                                          if isinstance(r, Row)))
        try:
            inputs = self._mixed_inputs(spec, seq, n, running)
        except Exception as e:  # the chunk's inputs (host side): that sequence ends, the others decode alone
            log.exception("mixed step inputs failed")
            return [self._fail(seq, e), *self._decode(running)]
        try:
            scores = self.backend.extend(spec, inputs)
            picks = self._pick(scores, rows)
        except Exception as e:  # the backend failed: these sequences end, the engine goes on
            log.exception("mixed step failed")
            return [self._fail(s, e) for s in [*running, seq]]
        self._prefilled(seq, n)
        if last:
            self.batch.start(seq.slot, len(seq.prompt_ids))
        else:
            self.batch.park(seq.slot, seq.prefilled)
        self._keep_hiddens(scores, [(s.slot, s) for s in running] + ([(self.max_batch, seq)] if last else []))
        todo = list(zip(running, picks)) + ([(seq, picks[-1])] if last else [])
        return [self._guard(s, lambda s, t=t: self._emit(s, t)) for s, t in todo]

    def _keep_hiddens(self, scores, rows: list[tuple[int, Sequence]]) -> None:
        """Beside an MTP drafter (the `_h` graphs): each (row of `scores`, sequence)'s hidden state at the position
        it was fed, which its next round of drafts reads (no plain decode step first)."""
        hidden = getattr(scores, "hidden", None)
        for row, s in rows if hidden is not None else ():
            self._keep_hidden(s, hidden[row], s.next_position)

    def _mixed_inputs(self, spec, seq: Sequence, n: int, running: list[Sequence]) -> tuple:
        """The mixed graph's inputs: every slot's decode row (`seq`'s parked at its chunk's first position, which
        the chunk then overwrites) and `seq`'s next `n` prompt tokens as one extend row."""
        start = seq.prefilled
        self.batch.park(seq.slot, start)
        decode = self.batch.inputs([(s.slot, s.output_ids[-1], s.next_position) for s in running])
        chunk_spec = self.backend.extend_spec(self.extend_t, 1)
        chunk = extend_inputs(chunk_spec, [(seq.slot, seq.feed[start:start + n], start)], self.model.ple,
                              self.dims.sliding_window)
        return mixed_inputs(spec, dict(zip(self.batch.names, decode)),
                            {x.name: v for x, v in zip(chunk_spec.host_inputs, chunk)})

    def _vacate(self, slot: int, seq: Sequence | None) -> None:
        """`slot` is free: with prefix reuse it keeps what `seq` left in it (None: nothing worth keeping, e.g.
        after a failure) and its idle decode row is parked just past that history, where a write harms nothing
        a later match reads (`PrefixCache`); else its row decodes a pad at position 0."""
        history = seq.cached if seq is not None and self.prefix is not None else []
        if history and len(history) < self.max_context:
            self.prefix.keep(slot, history, seq.reach)
            self.batch.park(slot, len(history))
            return
        if self.prefix is not None:
            self.prefix.drop(slot)
        self.batch.free(slot)
