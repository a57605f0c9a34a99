"""The values a ModelServer replica streams to the Router for one request: small typed events.

Order: `Started` (the prompt was accepted) or `Failed` (it was not), then for streams any number of
`Delta`s (several tokens may be coalesced into one when the reader lags), then `Finished` or `Failed`.
A non-streaming request gets no `Delta`: `Finished` carries the whole text. Imports nothing heavy: the
router process must stay free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Started:
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[dict, ...] = ()  # per token when asked: {token, logprob, bytes, top_logprobs}


@dataclass(frozen=True, slots=True)
class Finished:
    finish_reason: str  # stop | length
    prompt_tokens: int
    completion_tokens: int
    text: str = ""  # the whole output for a non-streaming request, "" for a stream
    logprobs: tuple[dict, ...] = ()  # a non-streaming request's per-token logprobs, when asked


@dataclass(frozen=True, slots=True)
class Failed:
    status: int  # the HTTP status the router answers with (before a stream starts)
    message: str
    code: str | None = None
    param: str | None = None
    type: str = "invalid_request_error"


ReplicaEvent = Started | Delta | Finished | Failed


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """What the router asks a replica for: a chat (`messages`) or a completion (`prompt`: text or ids)."""

    kind: str  # chat | completion
    prompt: str | tuple[int, ...] | None = None
    messages: tuple[dict, ...] = ()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    sampling: tuple[tuple[str, float | int], ...] = ()  # the fields the request set; the replica fills the rest
    ignore_eos: bool = False
    stream: bool = False
    tools: tuple[dict, ...] = ()  # OpenAI tool definitions, for the chat template
    template_kwargs: tuple[tuple[str, bool], ...] = ()  # e.g. (("enable_thinking", True),)
    grammar: str | None = None  # llguidance grammar every token must follow (`serve_app.constraints`)
    grammar_param: str | None = None  # the request field it comes from (for a 400)
    logprobs: int | None = None  # None: none; n: each token's logprob and the top n
    keep_special: bool = False  # keep control tokens in the text (the router's output parsers need them)
