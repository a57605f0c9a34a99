"""The engine's output events, one per sequence per step: a new token, or the sequence's error. Imports
no torch (the serving side reads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One new token of sequence `seq_id`."""

    seq_id: int
    token_id: int
    text: str  # text this token completes, after stop strings ("" without a tokenizer or mid-character)
    finish_reason: str | None  # None while generating, then "stop" or "length"
    logprob: float | None = None  # when the sequence asked for logprobs: the token's (model distribution)
    top: tuple[tuple[int, float], ...] = ()  # and the top n (token id, logprob), best first
    # the first event of a sequence that asked for prompt logprobs: per prompt token, None for the first, else
    # (its logprob given the tokens before it, the top n (token id, logprob) there, its rank: 1 the most likely)
    prompt_logprobs: tuple | None = None
    stop_str: str | None = None  # the final event of a sequence a stop string ended: which one

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """Sequence `seq_id` ended on an internal error (its slot is freed; other sequences carry on)."""

    seq_id: int
    message: str
    param: str | None = None  # the request field at fault (a grammar that failed while it ran), else ours
    final: bool = True


EngineEvent = TokenEvent | ErrorEvent
