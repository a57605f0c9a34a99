"""OpenAI-compatible request models, response bodies and the error envelope.

Owns validation at the HTTP boundary (pydantic, so a wrong type or range is a 400 naming the field) and
the JSON shapes of /v1/completions and /v1/chat/completions, streamed or not. Imports neither torch nor
anything Neuron (the sampling limits come from `neuron_workers.engine.params`, which imports no torch): the
router that uses it must stay light and never touch a NeuronCore.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from neuron_workers.engine.params import BIAS_RANGE, MAX_LOGIT_BIAS, PENALTY_RANGE, REPETITION_RANGE
from serve_app.events import GenerateRequest
from serve_app.openai import protocol_tools as T
from serve_app.openai.constraints import ConstraintError
from serve_app.openai.media_parts import ImageURLPart, InputAudioPart, media_of
from serve_app.openai.schema_render import tool_for_template

MAX_STOP = 4
PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty")
SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch.Generator takes
MAX_N = 8  # choices per request (each its own engine sequence)
MAX_N_TOKENS = 32_768  # n * max_tokens at most: one request cannot ask for more new tokens than this
# OpenAI fields we do not implement: a request that sets one gets a 400 naming it, never a silent ignore.
# (value that means "not used": a request may send it)
UNSUPPORTED = {"functions": None, "function_call": None, "echo": False, "best_of": None, "suffix": None,
               "audio": None, "modalities": None, "prediction": None, "reasoning_effort": None,
               "web_search_options": None}
CHAT_ONLY = {"tools": None, "tool_choice": None, "parallel_tool_calls": None, "response_format": None,
             "top_logprobs": None, "chat_template_kwargs": None}
STRICT = ConfigDict(extra="ignore", strict=True)  # "stream": "yes" or "max_tokens": true are 400s, not coerced


def utf8(v):
    """Refuse strings that cannot be encoded as UTF-8 (lone surrogates such as "\\ud800")."""
    for s in [v] if isinstance(v, str) else v if isinstance(v, list) else []:
        if isinstance(s, str):
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("contains an unpaired surrogate (not valid Unicode text)") from None
    return v


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints. Unset sampling fields take the model's generation_config.
    Unknown fields that are not OpenAI's are ignored, as OpenAI does."""

    model_config = STRICT

    model: str = Field(description="Name of a configured model (GET /v1/models)")
    max_tokens: int | None = Field(None, ge=1, description="New tokens to generate at most")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="-1 or 0: off (extension, as in vLLM)")
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=MAX_N, description=f"choices, each its own sequence (at most {MAX_N}); "
                                                          "a seeded choice i samples with seed + i")
    ignore_eos: bool = False
    frequency_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    presence_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    repetition_penalty: float | None = Field(None, ge=REPETITION_RANGE[0], le=REPETITION_RANGE[1],
                                             description="1: off; transformers' rule (extension, as in vLLM)")
    logit_bias: dict[str, float] | None = Field(None, description="token id (a string) -> bias in [-100, 100]")
    refused: ClassVar[dict] = UNSUPPORTED

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data):
        if isinstance(data, dict):
            for name, unused in cls.refused.items():
                value = data.get(name, unused)
                if value not in (unused, None) and value != [] and value != {}:  # empty: nothing asked for
                    raise UnsupportedField(name)
        return data

    @field_validator("model", "stop")
    @classmethod
    def _utf8(cls, v):
        return utf8(v)

    @model_validator(mode="after")
    def _stream_and_n(self):
        if self.stream_options is not None and not self.stream:
            raise ConstraintError("stream_options", "stream_options is only allowed when stream is true")
        n, most = self.n or 1, self.new_tokens_bound()
        if n > 1 and most is not None and n * most > MAX_N_TOKENS:
            raise ConstraintError("n", f"n * max_tokens is {n * most}; at most {MAX_N_TOKENS} new tokens a request")
        return self

    def new_tokens_bound(self) -> int | None:
        return self.max_tokens

    def choice_sampling(self, i: int) -> dict:
        """The sampling fields of choice i: a seeded request's choice i samples with seed + i (kept in range)."""
        out = self.sampling()
        if i and "seed" in out:
            low, high = SEED_RANGE
            out["seed"] = (out["seed"] - low + i) % (high - low + 1) + low
        return out

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        utf8(stops)
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"stop takes at most {MAX_STOP} non-empty strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        """OpenAI's shape: token ids as decimal strings (written plainly: "7", not "07" or " 7"), each bias in
        [-100, 100]; whether an id is in the vocabulary the engine checks (it knows the model)."""
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"takes at most {MAX_LOGIT_BIAS} entries")
        for key, bias in v.items():
            if not (key.isascii() and key.isdigit() and len(key) <= 10 and str(int(key)) == key):
                raise ValueError(f"keys must be token ids written as decimal strings, got {key[:20]!r}")
            if not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
                low, high = BIAS_RANGE
                raise ValueError(f"biases must be in [{low:g}, {high:g}], got {bias} for token {key}")
        return v

    def sampling(self) -> dict:
        """The sampling fields the request set (the replica fills the rest from the model's defaults)."""
        out = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "seed", *PENALTIES)
               if getattr(self, k) is not None}
        if out.get("top_k") == -1:
            out["top_k"] = 0
        if self.logit_bias:
            out["logit_bias"] = tuple(sorted((int(k), float(b)) for k, b in self.logit_bias.items()))
        return out


class UnsupportedField(ValueError):
    """A request set an OpenAI field this server does not implement."""

    def __init__(self, name: str):
        super().__init__(f"`{name}` is not supported by this server")
        self.name = name


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str

    @field_validator("text")
    @classmethod
    def _utf8(cls, v):
        return utf8(v)


ContentPart = Annotated[TextPart | ImageURLPart | InputAudioPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "model", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[T.ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool results
    name: str | None = None
    # an assistant turn's reasoning, as we return it (vLLM's `reasoning_content`, or `reasoning`): the template
    # replays it where the model expects its earlier thoughts (after the last user turn)
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content", "tool_call_id", "name", "reasoning_content", "reasoning")
    @classmethod
    def _utf8(cls, v):
        return utf8(v)

    @model_validator(mode="after")
    def _shape(self):
        if self.content is None and not (self.role in ("assistant", "model") and self.tool_calls):
            raise ValueError(f"a message with role `{self.role}` needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content if isinstance(p, TextPart))


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[T.Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | T.NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: T.ResponseFormat | None = None
    chat_template_kwargs: T.TemplateKwargs | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    _grammar: tuple = PrivateAttr((None, None, None))
    _messages: tuple = PrivateAttr(())
    _media: tuple = PrivateAttr(())

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, v):
        if isinstance(v, dict) and v.get("type") == "function" and not isinstance(v.get("function"), dict):
            raise ConstraintError("tool_choice", 'a tool_choice object names its function: {"type": "function", '
                                                 '"function": {"name": "..."}} (or use "auto", "none", "required")')
        return v

    @model_validator(mode="after")
    def _agentic(self):
        """Check tools, tool_choice and response_format and build the grammar they force (a 400 naming the
        param when they cannot be served); the message history as the chat template wants it."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ConstraintError("top_logprobs", "top_logprobs needs logprobs: true")
        choice = self.tool_choice or ("auto" if self.tools else "none")
        self._grammar = T.grammar_for(self.tools, choice, self.parallel_tool_calls, self.response_format,
                                      self.thinking, self.max_completion_tokens or self.max_tokens)
        self._messages = T.history(self.messages)
        self._media = media_of(self.messages)
        return self

    @property
    def thinking(self) -> bool:
        return bool(self.chat_template_kwargs and self.chat_template_kwargs.enable_thinking)

    @property
    def parsed_tools(self) -> list[str]:
        """The tools whose calls the output parser turns into tool_calls (none with tool_choice "none")."""
        return [] if self.tool_choice == "none" else T.tool_names(self.tools)

    def new_tokens_bound(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def payloads(self) -> list[GenerateRequest]:
        return [self.payload(i) for i in range(self.n or 1)]

    def payload(self, choice: int = 0) -> GenerateRequest:
        grammar, in_thought, param = self._grammar
        kwargs = {"enable_thinking": True} if self.thinking else {}
        return GenerateRequest("chat", messages=self._messages,
                               max_tokens=self.max_completion_tokens or self.max_tokens,
                               stop=tuple(self.stop or ()), sampling=tuple(self.choice_sampling(choice).items()),
                               ignore_eos=self.ignore_eos, stream=self.stream,
                               tools=tuple(tool_for_template(t.model_dump(exclude_none=True))
                                           for t in self.tools or ()),
                               template_kwargs=tuple(kwargs.items()), grammar=grammar, grammar_in_thought=in_thought,
                               grammar_param=param,
                               logprobs=(self.top_logprobs or 0) if self.logprobs else None,
                               keep_special=True,  # the router's parsers read the control tokens
                               media=self._media)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(16, ge=0, description="0: the prompt is only scored (with echo, as vLLM)")
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False  # the prompt comes back before the completion; with logprobs, its tokens' logprobs too
    prompt_logprobs: int | None = Field(None, ge=0, le=20, description="vLLM's extension: each prompt token's "
                                        "logprob and the top n, as `prompt_logprobs` of each choice")
    refused: ClassVar[dict] = {**{k: v for k, v in UNSUPPORTED.items() if k != "echo"}, **CHAT_ONLY}

    @model_validator(mode="after")
    def _echo(self):
        if self.max_tokens == 0 and not self.echo:
            raise ConstraintError("max_tokens", "max_tokens 0 scores the prompt only: it needs echo: true")
        return self

    def scored(self) -> int | None:
        """The top n of prompt logprobs the engine computes (None: none): what echo with logprobs and
        `prompt_logprobs` ask for, or 0 when an echo of token ids needs the tokens' text."""
        asked = [n for n in (self.logprobs if self.echo else None, self.prompt_logprobs) if n is not None]
        if asked:
            return max(asked)
        return 0 if self.echo and not isinstance(self.prompt, str) else None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        utf8(v)
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], str):
                if len(v) != 1:
                    raise ValueError("only one prompt per request is supported")
                return v[0]
        return v

    def payloads(self) -> list[GenerateRequest]:
        return [self.payload(i) for i in range(self.n or 1)]

    def payload(self, choice: int = 0) -> GenerateRequest:
        prompt = self.prompt if isinstance(self.prompt, str) else tuple(self.prompt)
        return GenerateRequest("completion", prompt=prompt, max_tokens=max(self.max_tokens or 0, 1) if
                               self.max_tokens is not None else None, stop=tuple(self.stop or ()),
                               sampling=tuple(self.choice_sampling(choice).items()), ignore_eos=self.ignore_eos,
                               stream=self.stream, logprobs=self.logprobs, prompt_logprobs=self.scored())


# --- responses --------------------------------------------------------------------------------------

def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None, index: int = 0) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def completion_chunk(rid: str, model: str, text: str, finish: str | None, index: int = 0) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": None}]}


def completion_response(rid: str, model: str, text: str, finish: str, prompt: int, completion: int) -> dict:
    body = completion_chunk(rid, model, text, finish)
    body["usage"] = usage(prompt, completion)
    return body
