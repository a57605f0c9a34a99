"""OpenAI-compatible request models, response bodies and the error envelope.

Owns validation at the HTTP boundary (pydantic, so a wrong type or range is a 400 naming the field) and
the JSON shapes of /v1/completions and /v1/chat/completions, streamed or not. Imports neither torch nor
anything Neuron: the router that uses it must stay light and never touch a NeuronCore.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.events import GenerateRequest

MAX_STOP = 4
SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch.Generator takes
# OpenAI fields we do not implement: a request that sets one gets a 400 naming it, never a silent ignore.
# (value that means "not used": a request may send it)
UNSUPPORTED = {"tools": None, "tool_choice": None, "functions": None, "function_call": None,
               "parallel_tool_calls": None, "response_format": None, "echo": False, "best_of": None,
               "logit_bias": None, "suffix": None, "top_logprobs": None, "presence_penalty": 0,
               "frequency_penalty": 0, "audio": None, "modalities": None, "prediction": None,
               "reasoning_effort": None, "web_search_options": None}
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
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    ignore_eos: bool = False
    logprobs: bool | int | None = None

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data):
        if isinstance(data, dict):
            for name, unused in UNSUPPORTED.items():
                value = data.get(name, unused)
                if value not in (unused, None) and value != [] and value != {}:  # empty: nothing asked for
                    raise UnsupportedField(name)
        return data

    @field_validator("model", "stop")
    @classmethod
    def _utf8(cls, v):
        return utf8(v)

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        if v:
            raise ValueError("logprobs are not supported yet")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        utf8(stops)
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"stop takes at most {MAX_STOP} non-empty strings")
        return stops

    def sampling(self) -> dict:
        """The sampling fields the request set (the replica fills the rest from the model's defaults)."""
        out = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "seed") if getattr(self, k) is not None}
        if out.get("top_k") == -1:
            out["top_k"] = 0
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


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "user", "assistant", "model"]
    content: str | list[TextPart]

    @field_validator("content")
    @classmethod
    def _utf8(cls, v):
        return utf8(v)

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def payload(self) -> GenerateRequest:
        msgs = tuple({"role": "assistant" if m.role == "model" else m.role, "content": m.text()}
                     for m in self.messages)
        return GenerateRequest("chat", messages=msgs, max_tokens=self.max_completion_tokens or self.max_tokens,
                               stop=tuple(self.stop or ()), sampling=tuple(self.sampling().items()),
                               ignore_eos=self.ignore_eos, stream=self.stream)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(16, ge=1)

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

    def payload(self) -> GenerateRequest:
        prompt = self.prompt if isinstance(self.prompt, str) else tuple(self.prompt)
        return GenerateRequest("completion", prompt=prompt, max_tokens=self.max_tokens, stop=tuple(self.stop or ()),
                               sampling=tuple(self.sampling().items()), ignore_eos=self.ignore_eos,
                               stream=self.stream)


# --- responses --------------------------------------------------------------------------------------

def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}


def chat_response(rid: str, model: str, text: str, finish: str, prompt: int, completion: int) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish, "logprobs": None}],
            "usage": usage(prompt, completion)}


def completion_response(rid: str, model: str, text: str, finish: str, prompt: int, completion: int) -> dict:
    body = completion_chunk(rid, model, text, finish)
    body["usage"] = usage(prompt, completion)
    return body
