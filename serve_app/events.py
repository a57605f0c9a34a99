"""The values a ModelServer replica streams to the Router for one request: small typed events.

Every message costs CPU in the replica, the router and the proxy, so a request gets as few as it can:
- a stream (`ModelServer.generate`): any number of `Delta`s (the tokens that arrived since the last one,
  the first at once), then `Finished` with the text not yet sent, or `Failed` at any point. A stream
  whose first token is not ready within `HEADERS_WITHIN_S` (queued behind a full batch, a long prefill)
  gets `Started` first, so the client has its headers.
- a non-streaming request (`ModelServer.complete`, one call, one answer): `Finished` with the whole
  text, or `Failed`.
Imports nothing heavy: the router process must stay free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADERS_WITHIN_S = 0.25
MAX_MEDIA_BYTES = 20 * 1024 * 1024  # one image or audio clip, decoded (OpenAI's image limit is 20 MB)


@dataclass(frozen=True, slots=True)
class Started:
    """The prompt was accepted; its first token is not ready yet (streams only)."""

    prompt_tokens: int
    in_thought: bool = False  # the rendered prompt ends inside a thought channel (set on a request's first event)


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[dict, ...] = ()  # per token when asked: {token, logprob, bytes, top_logprobs}
    in_thought: bool = False
    prompt_tokens: int = 0  # the prompt's length (Anthropic's `message_start` reports it before any text)
    prompt_logprobs: tuple[dict, ...] = ()  # a request's first event, when asked: per prompt token (the first's
    # logprob None) {token, id, logprob, rank, bytes, top_logprobs}


@dataclass(frozen=True, slots=True)
class Finished:
    finish_reason: str  # stop | length
    prompt_tokens: int
    completion_tokens: int
    text: str = ""  # the text no Delta carried: a non-streaming request's whole output, a stream's tail
    logprobs: tuple[dict, ...] = ()  # per-token logprobs of those tokens, when asked
    in_thought: bool = False
    prompt_logprobs: tuple[dict, ...] = ()  # as Delta's, when no Delta came first
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop"), if one did


@dataclass(frozen=True, slots=True)
class Failed:
    status: int  # the HTTP status the router answers with (before a stream starts)
    message: str
    code: str | None = None
    param: str | None = None
    type: str = "invalid_request_error"


ReplicaEvent = Started | Delta | Finished | Failed


@dataclass(frozen=True, slots=True)
class MediaPart:
    """One image or audio clip of a request, as the router passes it on (`openai/media_parts.py`): its bytes (a
    data: URL or base64, decoded) or an http(s) URL the replica fetches; decoded in the replica."""

    kind: str  # image | audio
    param: str  # the request field it came from, e.g. messages.0.content.1.image_url (named by a 400)
    data: bytes = b""
    url: str = ""
    format: str = ""  # audio: wav; image: the data: URL's subtype (png, jpeg, ...)


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """What the router asks a replica for: a chat (`messages`) or a completion (`prompt`: text or ids). Every API
    shape (chat and completions, the Responses API, Anthropic's Messages) becomes one of these; `n` choices are n
    of them, a seeded choice i with seed + i."""

    kind: str  # chat | completion
    prompt: str | tuple[int, ...] | None = None
    messages: tuple[dict, ...] = ()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    sampling: tuple[tuple[str, object], ...] = ()  # the fields the request set (logit_bias: (id, bias) pairs);
    # the replica fills the rest
    ignore_eos: bool = False
    stream: bool = False
    tools: tuple[dict, ...] = ()  # OpenAI tool definitions, for the chat template
    template_kwargs: tuple[tuple[str, bool], ...] = ()  # e.g. (("enable_thinking", True),)
    grammar: str | None = None  # llguidance grammar every token must follow (`serve_app.openai.constraints`)
    grammar_in_thought: str | None = None  # its variant for a prompt that ends inside a thought channel
    grammar_param: str | None = None  # the request field it comes from (for a 400)
    logprobs: int | None = None  # None: none; n: each token's logprob and the top n
    prompt_logprobs: int | None = None  # None: none; n: each prompt token's logprob and the top n (echo)
    keep_special: bool = False  # keep control tokens in the text (the router's output parsers need them)
    media: tuple[MediaPart, ...] = ()  # a chat's images and audio clips, in the order its template renders them
