"""The engine: continuous batching of sequences over one backend's static graphs.

`add` queues a sequence, `cancel` drops one, `step` does one round: admit waiting sequences into free
slots (each prefilled on its own, batch 1, into its slot; with `prefill_chunk` a longer prompt goes through
the extend graph one chunk a step, `scheduler.prefill_work`; with `prefix_cache` a slot keeps its KV when its
sequence ends and a prompt starting with the same tokens prefills only the rest: `engine/prefill.py`,
`engine/prefix_cache.py`), then one decode step over every running row (with `speculative_tokens`, a
verify step of the drafts instead: `engine/speculate.py`; with a chunk to prefill beside running rows, both in
the mixed graph: `Prefills._mixed`),
per-row sampling, stop rules and detokenization; it returns the step's events. The engine owns host-side
work only (PLE lookup, masks, sampling, stops, detokenization); the backend owns the graphs and the KV
buffers. It is not thread-safe: one thread drives it (`loop.EngineLoop` in a server; `generate`
and `run_all` in the CLI and tests).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Iterator

import torch

from neuron_workers.backends import Backend
from neuron_workers.engine.detokenizer import IncrementalDetokenizer
from neuron_workers.engine.events import EngineEvent, ErrorEvent, TokenEvent
from neuron_workers.engine.grammar import GrammarError, Grammars, RowGrammar
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.penalties import Penalties
from neuron_workers.engine.prefill import Prefills
from neuron_workers.engine.prefix_cache import MIN_REUSE, PrefixCache
from neuron_workers.engine.prefix_windows import WindowPool, keep_points
from neuron_workers.engine.sampling import Row, Sampled, make_generator, needs_logits, sample_rows
from neuron_workers.engine.scheduler import Scheduler
from neuron_workers.engine.sequence import Sequence
from neuron_workers.engine.speculate import Speculation, check_speculative_tokens
from neuron_workers.engine.stops import StopStrings
from neuron_workers.engine.texts import Texts
from neuron_workers.errors import ContextLengthError, UserError
from neuron_workers.model.host_inputs import PAD_ID, DecodeBatch
from neuron_workers.model.spec import DECODE

log = logging.getLogger(__name__)


class Engine(Texts, Prefills, Speculation):
    def __init__(self, model, backend: Backend, prefill_tokens_per_step: int | None = None, prefill_chunk: int = 0,
                 prefix_cache: bool = False, extend_t: int = 0, speculative_tokens: int = 0, prefix_windows: int = 0):
        self.model, self.backend = model, backend
        self.dims, self.tokenizer = model.dims, model.tokenizer
        self.max_context, self.max_batch = backend.max_context, backend.max_batch
        self.batch = DecodeBatch(backend.spec(DECODE), model.ple, self.dims.sliding_window)
        self.soft_ids = frozenset(getattr(model, "soft_ids", ()))  # fed as the pad token outside media (transformers)
        self.batch.pad_ids = torch.tensor(sorted(self.soft_ids), dtype=torch.int64)
        self.prefill_chunk = prefill_chunk  # 0: whole prompts; else longer ones go through the extend graph
        self.extend_t = prefill_chunk or extend_t  # T of the extend graph (chunks, and the rest of a reused prefix)
        self.prefix = PrefixCache(self.batch.window, self.batch.ring, self._window_pool(prefix_windows)) \
            if prefix_cache and self.extend_t else None
        budget = prefill_tokens_per_step or (prefill_chunk + self.max_batch if prefill_chunk else max(backend.buckets))
        self.scheduler = Scheduler(self.max_batch, budget, prefill_chunk, self.prefix, self.extend_t)
        check_speculative_tokens(speculative_tokens, self.batch.ring, self.batch.window, self.max_context)
        self.spec_k = speculative_tokens  # prompt-lookup drafts per row and step (engine/speculate.py)
        # a chunk and the decode rows in one graph (`Prefills._mixed`; with a drafter that step decodes instead of
        # verifying); not on artifacts built without it
        self.mixed_steps = bool(self.extend_t and getattr(backend, "mixed_steps", False))
        self.last_decode_rows = 0  # rows in the latest decode step (batch occupancy)
        self._grammars, self._grammars_lock = None, threading.Lock()
        self._turn_end = _token_id(self.tokenizer, "<turn|>")  # kept-window points: the first turn's end
        self.media = None  # media.support.MediaSupport when the graphs take media (`factory.with_media`)

    def _window_pool(self, entries: int) -> WindowPool | None:
        """The kept sliding windows (`engine/prefix_windows.py`): `entries` of them on the backend, unless the
        rings hold the whole context (they never wrap)."""
        if entries <= 0 or self.batch.ring >= self.max_context:
            return None
        self.backend.make_window_pool(entries)
        return WindowPool(entries)

    @property
    def sampling_defaults(self) -> dict:
        return dict(self.model.info.sampling_defaults)

    def close(self) -> None:
        self.backend.close()

    def validate(self, prompt_ids: list[int], max_tokens: int) -> None:
        """Raise a UserError unless the ids are in the vocabulary and prompt + new tokens fit the context."""
        vocab = self.dims.vocab_size
        bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise UserError(f"token ids must be integers in [0, {vocab}); got {bad[:3]}", param="prompt")
        self.check_fits(len(prompt_ids), max_tokens)

    def check_fits(self, n_prompt: int, max_tokens: int) -> None:
        if n_prompt < 1:
            raise UserError("the prompt is empty", param="prompt")
        if n_prompt + max_tokens > self.max_context:
            raise ContextLengthError(
                f"this model's context is {self.max_context} tokens; the prompt has {n_prompt} and "
                f"{max_tokens} new tokens were asked for ({n_prompt + max_tokens} in all)",
                param="max_tokens" if n_prompt < self.max_context else "prompt")

    @property
    def grammars(self) -> Grammars:
        """Grammar compilation for constrained rows (`compile` is thread-safe: call it off the engine thread).
        Made once under a lock: replica worker threads and the warm-up thread ask for it at once."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = Grammars(self.tokenizer, self.dims.vocab_size, self.model.eos_token_ids)
        return self._grammars

    @functools.cached_property
    def _bitmask(self):
        return torch.full((self.max_batch, self.grammars.words), -1, dtype=torch.int32)

    def new_sequence(self, prompt_ids: list[int], params: SamplingParams, stop: list[str] | None = None, *,
                     grammar: RowGrammar | None = None, logprobs: int | None = None,
                     skip_special_tokens: bool = True, prompt_logprobs: int | None = None,
                     media: tuple | list = ()) -> Sequence:
        """A validated sequence, ready for `add` (a UserError here costs the engine nothing). `grammar`
        (from `grammars.compile`) constrains every token; `logprobs` (n >= 0) asks for the chosen token's
        logprob and the top n; `prompt_logprobs` (n >= 0) the same for every prompt token (on its first event;
        its prompt is prefilled whole, `prefill.Prefills._score`); `skip_special_tokens=False` keeps control
        tokens in the text (for parsers). Penalties and a logit bias in `params` get the sequence's own
        `Penalties`. `media`: the prompt's `MediaInput`s (from `media.prepare`), in prompt order."""
        self.validate(prompt_ids, params.max_tokens)
        keys = self._media_keys(prompt_ids, media, prompt_logprobs)
        if prompt_logprobs is not None and not (self.extend_t and getattr(self.backend, "prompt_scores", False)):
            raise UserError("prompt logprobs need the per-position extend graph, which this backend does not have "
                            "(the cpu backend has it)", param="prompt_logprobs")
        vocab = self.dims.vocab_size
        bad = [t for t, _ in params.logit_bias if t >= vocab]
        if bad:
            raise UserError(f"logit_bias keys must be token ids in [0, {vocab}); got {bad[:3]}", param="logit_bias")
        eos = set() if params.ignore_eos else set(self.model.eos_token_ids)
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens, self.unused_ids) \
            if self.tokenizer else None
        windows = self.prefix is not None and self.prefix.windows is not None
        return Sequence(list(prompt_ids), params, frozenset(set(params.stop_token_ids) | eos),
                        None if params.greedy else make_generator(params.seed), detok, StopStrings(stop or []),
                        grammar=grammar, logprobs=logprobs,
                        penalties=Penalties(params, prompt_ids, vocab) if params.penalized else None,
                        keep_points=keep_points(prompt_ids, self._turn_end, self.extend_t, MIN_REUSE)
                        if windows else (), prompt_logprobs=prompt_logprobs, media=tuple(media),
                        prompt_keys=keys, fed_ids=self._fed(prompt_ids, keys))

    def _fed(self, prompt_ids: list[int], keys: list[int] | None) -> list[int] | None:
        """The prompt as the graphs take it when it differs: a soft-token id outside an image / audio item (its key
        is the id itself) becomes the pad token, which is what transformers embeds for it."""
        if not self.soft_ids or not any(t in self.soft_ids for t in prompt_ids):
            return None
        keys = keys if keys is not None else prompt_ids
        return [PAD_ID if t in self.soft_ids and k >= 0 else t for t, k in zip(prompt_ids, keys)]

    def _media_keys(self, prompt_ids: list[int], media, prompt_logprobs) -> list[int] | None:
        """Check the media items against the prompt (a UserError names what is wrong); the prompt's prefix-reuse
        keys with each soft token keyed by its item (`Sequence.keys`), or None without media."""
        if self.media is None:
            if media:
                raise UserError("this model takes no images or audio", param="messages")
            return None
        from neuron_workers.media.support import check_media

        return check_media(prompt_ids, tuple(media), self.dims, prompt_logprobs, self.prefill_chunk)

    # --- scheduling ----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def cancel(self, seq_id: int) -> bool:
        """Drop a waiting or running sequence; its slot is free for the next step. False if unknown."""
        seq = self.scheduler.cancel(seq_id)
        if seq is not None and seq.slot is not None:
            self._vacate(seq.slot, seq)
        return seq is not None

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[EngineEvent]:
        """Admit and prefill waiting sequences, then decode one token for every running one (with a chunk of a
        prompt in the same graph when there is one: `Prefills._mixed`)."""
        events: list[EngineEvent] = []
        decoding = sum(1 for s in self.scheduler.running.values() if s.output_ids)
        work = self.scheduler.prefill_work(decoding)
        events += [e for e in (self._guard(s, self._restore) for s, _ in work if s.restore is not None) if e]
        work = [(seq, n) for seq, n in work if not seq.finished]
        mixed = self._mixable(work, decoding)
        for seq, n in (w for i, w in enumerate(work) if i != mixed):
            ev = self._guard(seq, lambda s, n=n: self._prefill_work(s, n))
            events += [ev] if ev is not None else []
        running = [s for s in self.scheduler.running.values() if s.output_ids]
        self.last_decode_rows = len(running)
        if mixed is not None:
            events += self._mixed(*work[mixed], running)
        elif running:
            events += self._speculate(running) if self.spec_k else self._decode(running)
        return events

    def _decode(self, running: list[Sequence]) -> list[EngineEvent]:
        try:
            inputs = self.batch.inputs([(s.slot, s.output_ids[-1], s.next_position) for s in running])
            rows = self._rows([(s.slot, s) for s in running])
            k = getattr(self.backend, "candidates", 0)  # the top-K decode graph, when no row needs the logits
            if k and not any(needs_logits(r, k) for r in rows if isinstance(r, Row)):
                scores = self.backend.decode_candidates(inputs)
                self._keep_hiddens(scores, [(s.slot, s) for s in running])
            else:
                self._ready_drafters(running, inputs)
                scores = self.backend.decode(inputs)
            picks = self._pick(scores, rows)
        except Exception as e:  # the backend failed: every running sequence ends, the engine goes on
            log.exception("decode step failed")
            return [self._fail(s, e) for s in running]
        return [self._guard(s, lambda s, t=t: self._emit(s, t)) for s, t in zip(running, picks)]

    def _ready_drafters(self, running: list[Sequence], inputs) -> None:
        """Beside an MTP drafter, a decode step that needs the full logits returns no hidden state. The rows that
        could draft but hold none first run the top-K `_h` decode graph over the same inputs (the same K/V write),
        which leaves them theirs: they draft from the next step on, once per row, not never (rows with no room
        to draft the step after run nothing more)."""
        if not hasattr(self.drafter, "propose_all"):
            return
        rows = [(s.slot, s) for s in running
                if self._can_speculate(s) and not self.drafter.ready(s) and self._room(s, ahead=1) > 0]
        if rows:
            self._keep_hiddens(self.backend.decode_candidates(inputs), rows)

    def _sample(self, logits, rows: list[tuple[int, Sequence]]) -> list[Sampled]:
        return self._pick(logits, self._rows(rows))

    def _rows(self, rows: list[tuple[int, Sequence]]) -> list[Row | Sampled]:
        """What each row asks of the sampler (which also decides whether the step needs full logits). A
        constrained row's mask is filled here, just before sampling; a grammar that fails gives that row
        alone an error (a `Sampled` with `error`) in place of its `Row`."""
        out: list[Row | Sampled] = []
        for i, (r, s) in enumerate(rows):
            allowed = None
            if s.grammar is not None:
                try:
                    s.grammar.fill(self._bitmask, i)
                except Exception as e:  # a GrammarError is the request's (param), anything else ours
                    param = getattr(e, "param", None)
                    out.append(Sampled(-1, error=str(e) if param else f"{type(e).__name__}: {e}", param=param))
                    continue
                allowed = self._bitmask[i]
            out.append(Row(r, s.params, s.generator, allowed, s.logprobs, s.penalties))
        return out

    def _pick(self, scores, rows: list[Row | Sampled]) -> list[Sampled]:
        good = [x for x in rows if isinstance(x, Row)]
        picks = iter(sample_rows(scores, good, self.dims.final_logit_softcapping) if good else [])
        return [next(picks) if isinstance(x, Row) else x for x in rows]

    def _emit(self, seq: Sequence, pick: Sampled) -> TokenEvent:
        if pick.error:  # this sequence alone fails (`_guard`)
            raise GrammarError(pick.error, pick.param) if pick.param else RuntimeError(pick.error)
        if seq.grammar is not None:
            seq.grammar.accept(pick.token)  # GrammarError: this sequence alone fails
        ev = seq.append(pick.token, pick, done=seq.grammar is not None and seq.grammar.done)
        if ev.final:
            self._release(seq)
        return ev

    def _guard(self, seq: Sequence, fn) -> EngineEvent:
        """fn(seq), or a ErrorEvent for this sequence alone when it raises."""
        try:
            return fn(seq)
        except GrammarError as e:  # the request's grammar: one line, no traceback
            log.info("sequence %d failed: %s", seq.seq_id, e)
            return self._fail(seq, e)
        except Exception as e:
            log.exception("sequence %d failed", seq.seq_id)
            return self._fail(seq, e)

    def _fail(self, seq: Sequence, e: Exception) -> ErrorEvent:
        seq.finish_reason = "error"
        self._release(seq, keep=False)  # a failed step may have left anything in the slot
        param = getattr(e, "param", None)
        return ErrorEvent(seq.seq_id, str(e) if param else f"{type(e).__name__}: {e}", param)

    def _release(self, seq: Sequence, keep: bool = True) -> None:
        self.scheduler.finish(seq)
        if seq.slot is not None:
            self._vacate(seq.slot, seq if keep else None)

    # --- driving it from one thread ------------------------------------------------------------
    def run_all(self, seqs: list[Sequence]) -> Iterator[EngineEvent]:
        """Add `seqs` and step until all of them finished, yielding their events as they come."""
        pending = {s.seq_id for s in seqs}
        for s in seqs:
            self.add(s)
        try:
            while pending:
                for ev in self.step():
                    if ev.seq_id in pending:
                        yield ev
                        if ev.final:
                            pending.discard(ev.seq_id)
        finally:  # a caller that stops early frees the slots
            for seq_id in pending:
                self.cancel(seq_id)

    def generate(self, prompt_ids: list[int], params: SamplingParams, stop: list[str] | None = None
                 ) -> Iterator[TokenEvent]:
        """One sequence, token by token (raises RuntimeError if it fails)."""
        for ev in self.run_all([self.new_sequence(prompt_ids, params, stop)]):
            if isinstance(ev, ErrorEvent):
                raise RuntimeError(ev.message)
            yield ev


def _token_id(tokenizer, token: str) -> int | None:
    """The id of a special token in this tokenizer's vocabulary, or None."""
    try:
        i = tokenizer.convert_tokens_to_ids(token) if tokenizer is not None else None
    except Exception:
        return None
    return i if isinstance(i, int) and tokenizer.convert_ids_to_tokens(i) == token else None
