"""`POST /tokenize` and `POST /detokenize`, as vLLM has them: a prompt (`{model, prompt}`) or a chat (`{model,
messages, tools, chat_template_kwargs, add_generation_prompt}`) becomes exactly the ids the engine would see
(the same rendering, splits and schema rewrites as a chat completion; an image or audio clip counted as its soft
tokens, as transformers' processor expands it), with `count` and `max_model_len`, and
`token_strs` when `return_token_strs`; `{model, tokens}` becomes `{prompt}`. The replica does the work
(`serve_app.replica.prepare.tokenize` / `detokenize`); a bad field is a 400 naming it."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from serve_app.events import GenerateRequest
from serve_app.openai import protocol_tools as T
from serve_app.openai.media_parts import media_of
from serve_app.openai.protocol import STRICT, ChatMessage, utf8
from serve_app.openai.schema_render import tool_for_template


class TokenizeRequest(BaseModel):
    model_config = STRICT

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[T.Tool] | None = None
    chat_template_kwargs: T.TemplateKwargs | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise T.ConstraintError("prompt", "give either `prompt` or `messages`")
        utf8(self.prompt)
        if self.tools:
            T.check_tools(self.tools, "auto")
        return self

    def call_args(self) -> tuple:
        thinking = bool(self.chat_template_kwargs and self.chat_template_kwargs.enable_thinking)
        if self.messages is None:
            req = GenerateRequest("completion", prompt=self.prompt)
        else:
            req = GenerateRequest("chat", messages=T.history(self.messages),
                                  tools=tuple(tool_for_template(t.model_dump(exclude_none=True))
                                              for t in self.tools or ()),
                                  template_kwargs=(("enable_thinking", True),) if thinking else (),
                                  media=media_of(self.messages))
        return req, self.add_generation_prompt, self.add_special_tokens, self.return_token_strs


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: str
    tokens: list[int]
