"""OpenAI response bodies for one request, from the replica's events: the chat message (through
`chat_output.ChatOutput`: tool_calls, reasoning_content with thinking on, any thought channel removed with it
off, control tokens removed), logprobs in OpenAI's chat and completions shapes, streamed or not; with `n` > 1 one
`Output` a choice, joined by `Choices` (the stream's chunks interleaved, each with its choice's `index`). Pure
Python."""

from __future__ import annotations

import json
import time

from serve_app.events import Delta, Finished
from serve_app.openai import protocol as P
from serve_app.openai.chat_output import ChatOutput


def chat_logprobs(entries) -> dict:
    return {"content": list(entries)}


class CompletionLogprobs:
    """{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}, offsets running across chunks."""

    def __init__(self):
        self.offset = 0

    def __call__(self, entries) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            out["tokens"].append(e["token"])
            out["token_logprobs"].append(e["logprob"])
            out["top_logprobs"].append({t["token"]: t["logprob"] for t in e["top_logprobs"]})
            out["text_offset"].append(self.offset)
            self.offset += len(e["token"])
        return out


class Output:
    """Builds one request's bodies: `start`, `delta`, `finish` chunks for a stream, or `result`."""

    def __init__(self, body, rid: str, chat: bool, index: int = 0):
        self.rid, self.model, self.chat, self.body, self.index = rid, body.model, chat, body, index
        self.want_logprobs = bool(body.logprobs) if chat else body.logprobs is not None
        self.parse = chat  # every chat: tool calls, thought channels (a stray one too) and control tokens
        self.parser: ChatOutput | None = None
        self.logprobs = chat_logprobs if chat else CompletionLogprobs()

    def open(self, first) -> None:
        """Read the request's first event (`Started`, `Delta` or `Finished`): the output parser starts inside
        a thought channel when the rendered prompt ended inside one."""
        if self.parse and self.parser is None:
            b = self.body
            self.parser = ChatOutput(b.parsed_tools, b.thinking, b.parallel_tool_calls,
                                     in_thought=getattr(first, "in_thought", False))

    def _chunk(self, delta: dict | str, finish, logprobs=None) -> dict:
        if self.chat:
            body = P.chat_chunk(self.rid, self.model, delta, finish, self.index)
        else:
            body = P.completion_chunk(self.rid, self.model, delta, finish, self.index)
        if logprobs is not None:
            body["choices"][0]["logprobs"] = logprobs
        return body

    def start(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""}, None)] if self.chat else []

    def delta(self, ev: Delta) -> list[dict]:
        self.open(ev)
        lp = self.logprobs(ev.logprobs) if self.want_logprobs and ev.logprobs else None
        if not self.chat:
            return [self._chunk(ev.text, None, lp)] if ev.text or lp else []
        deltas = self.parser.feed(ev.text) if self.parser else ([{"content": ev.text}] if ev.text else [])
        if lp is not None and not deltas:
            deltas = [{}]
        return [self._chunk(d, None, lp if i == 0 else None) for i, d in enumerate(deltas)]

    def finish(self, ev: Finished) -> list[dict]:
        self.open(ev)
        if not self.chat:
            return [self._chunk("", ev.finish_reason)]
        out = [self._chunk(d, None) for d in self.parser.flush()] if self.parser else []
        reason = self.parser.finish_reason(ev.finish_reason) if self.parser else ev.finish_reason
        return out + [self._chunk({}, reason)]

    def result(self, ev: Finished) -> dict:
        self.open(ev)
        lp = self.logprobs(ev.logprobs) if self.want_logprobs else None
        if not self.chat:
            body = P.completion_response(self.rid, self.model, ev.text, ev.finish_reason, ev.prompt_tokens,
                                         ev.completion_tokens)
            body["choices"][0].update(index=self.index, logprobs=lp)
            return body
        if self.parser is None:
            msg, reason = {"role": "assistant", "content": ev.text}, ev.finish_reason
        else:
            self.parser.feed(ev.text)
            self.parser.flush()
            msg, reason = self.parser.message(), self.parser.finish_reason(ev.finish_reason)
        return {"id": self.rid, "object": "chat.completion", "created": int(time.time()), "model": self.model,
                "choices": [{"index": self.index, "message": msg, "finish_reason": reason, "logprobs": lp}],
                "usage": P.usage(ev.prompt_tokens, ev.completion_tokens)}


class Choices:
    """The `n` choices of one chat or completion request, in OpenAI's wire shape: `result` joins their bodies
    (usage: the prompt once, every choice's tokens), a stream's `head` / `delta` / `finish` / `fail` / `end` are
    SSE lines (the usage chunk, when asked for, after the last choice finished)."""

    def __init__(self, body, rid: str, chat: bool):
        self.rid, self.model, self.chat = rid, body.model, chat
        self.outs = [Output(body, rid, chat, i) for i in range(body.n or 1)]
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.finished: dict[int, Finished] = {}

    def result(self, events: list[Finished]) -> dict:
        bodies = [o.result(ev) for o, ev in zip(self.outs, events)]
        joined = bodies[0]
        joined["choices"] = [b["choices"][0] for b in bodies]
        joined["usage"] = P.usage(events[0].prompt_tokens, sum(ev.completion_tokens for ev in events))
        return joined

    def head(self, firsts) -> list[str]:
        out = []
        for o, first in zip(self.outs, firsts):
            o.open(first)
            out += [sse(c) for c in o.start()]
        return out

    def delta(self, i: int, ev: Delta) -> list[str]:
        return [sse(c) for c in self.outs[i].delta(ev)]

    def finish(self, i: int, ev: Finished) -> list[str]:
        o = self.outs[i]
        out = [sse(c) for c in o.delta(Delta(ev.text, (), ev.logprobs)) + o.finish(ev)]
        self.finished[i] = ev
        if self.include_usage and len(self.finished) == len(self.outs):
            done = list(self.finished.values())
            out.append(sse({"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                            "model": self.model, "choices": [],
                            "usage": P.usage(done[0].prompt_tokens, sum(e.completion_tokens for e in done))}))
        return out

    def fail(self, message: str, type_: str, param=None, code=None) -> list[str]:
        return [sse(P.error_body(message, type_, param, code))]

    def end(self) -> list[str]:
        return [sse("[DONE]")]


def sse(data: dict | str, event: str | None = None) -> str:
    body = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
    return f"event: {event}\n{body}" if event else body
