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

    @property
    def cached(self) -> list[int]:
        """The tokens whose KV its slot holds: the prompt prefilled so far and every output token but the last
        (which was never fed)."""
        fed = self.prompt_ids[: self.prefilled]
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
