"""Sequence: everything one request owns while the engine serves it: prompt ids, sampling parameters and
its own seeded generator, the output so far, its slot (KV row) while running, the incremental
detokenizer, stop ids and stop strings, its penalties' state, and how it finished. Pure host state; the engine
drives it."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from neuron_workers.engine.detokenizer import IncrementalDetokenizer
from neuron_workers.engine.events import TokenEvent
from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.sampling import Sampled
from neuron_workers.engine.stops import StopStrings

_ids = itertools.count(1)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    detok: IncrementalDetokenizer | None
    stops: StopStrings
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    slot: int | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    created_at: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None
    grammar: object | None = None  # grammar.RowGrammar: constrains every token
    logprobs: int | None = None  # None: no logprobs; n: the chosen token's and the top n
    penalties: object | None = None  # penalties.Penalties: its repetition / frequency / presence state, logit bias
    prefilled: int = 0  # prompt tokens whose KV is in the slot (chunked prefill advances it chunk by chunk)
    reused: int = 0  # of which the slot held already when it was admitted (prefix reuse)
    reach: int = 0  # 1 + the furthest position a verify step wrote (rejected drafts included)
    keep_points: tuple[int, ...] = ()  # prompt positions whose sliding windows its prefill keeps (prefix_windows)
    prompt_logprobs: int | None = None  # None: none; n: each prompt token's logprob and the top n (no reuse)
    prompt_lp: list = field(default_factory=list)  # what the prefill pieces found, in prompt order
    restore: tuple | None = None  # (slot to clone, kept window's pool entry) copied in before its first piece
    ngrams: object | None = None  # drafts.NgramIndex of its tokens, with prompt-lookup speculation
    hidden: object | None = None  # MTP drafter: the target's last hidden state [H] at position `hidden_at`
    hidden_at: int = -1
    media: tuple = ()  # media.types.MediaInput of its prompt, in prompt order
    prompt_keys: list[int] | None = None  # with media: the prompt ids, soft tokens keyed by their item's digest
    fed_ids: list[int] | None = None  # the prompt as the graphs take it, when it differs (soft tokens outside media)

    @property
    def feed(self) -> list[int]:
        """The prompt ids the graphs take: a media soft token outside an image / audio item is fed as the pad token
        (what transformers embeds for it)."""
        return self.fed_ids if self.fed_ids is not None else self.prompt_ids

    @property
    def keys(self) -> list[int]:
        """What prefix reuse compares: the prompt ids, each media soft token replaced by a key derived from its
        item's digest and index (`media.types.soft_key`), so only the same image / clip at the same place matches."""
        return self.prompt_keys if self.prompt_keys is not None else self.prompt_ids

    def media_rows(self, start: int, n: int):
        """(embeds [n, H], soft [n] bool, bidirectional blocks [(a, b)] in piece indices) of prompt tokens
        start .. start + n - 1, or None when no item is there (a piece never cuts a block: `Scheduler._piece`)."""
        items = [m for m in self.media if m.offset < start + n and m.end > start]
        if not items:
            return None
        embeds = torch.zeros(n, items[0].embeds.shape[1], dtype=items[0].embeds.dtype)
        soft = torch.zeros(n, dtype=torch.bool)
        for m in items:
            a, b = max(start, m.offset), min(start + n, m.end)
            embeds[a - start:b - start] = m.embeds[a - m.offset:b - m.offset]
            soft[a - start:b - start] = True
        blocks = [(m.offset - start, m.end - start) for m in items if m.bidirectional]
        return embeds, soft, blocks

    @property
    def cached(self) -> list[int]:
        """The tokens whose KV its slot holds (as prefix-reuse keys): the prompt prefilled so far and every output
        token but the last (which was never fed)."""
        fed = self.keys[: self.prefilled]
        return fed + self.output_ids[:-1] if self.prefilled == len(self.prompt_ids) else fed

    @property
    def next_position(self) -> int:
        """Position of the token the next decode step feeds (the last sampled one)."""
        return len(self.prompt_ids) + len(self.output_ids) - 1

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token: int, sampled: Sampled | None = None, done: bool = False) -> TokenEvent:
        """Record a sampled token; apply stop ids, max tokens and stop strings (and `done`: the grammar is
        complete); return its event, with the token's logprobs when the sequence asked for them."""
        self.output_ids.append(token)
        if self.penalties is not None:
            self.penalties.add(token)
        finish = "stop" if token in self.stop_ids or done else (
            "length" if len(self.output_ids) >= self.params.max_tokens else None)
        piece = self.detok.push(token) if self.detok else ""
        if finish and self.detok:
            piece += self.detok.flush()
        text = self.stops.feed(piece)
        if self.stops.hit:
            finish = "stop"
        elif finish:
            text += self.stops.flush()
        self.finish_reason = finish
        stop_str = self.stops.matched if self.stops.hit else None
        if self.logprobs is not None and sampled is not None and sampled.logprob is not None:
            return TokenEvent(self.seq_id, token, text, finish, sampled.logprob, sampled.top, stop_str=stop_str)
        return TokenEvent(self.seq_id, token, text, finish, stop_str=stop_str)
