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
            out["top_logprobs"].append({t["token"]: t["logprob"] for t in e["top_logprobs"]}
                                       if e["logprob"] is not None else None)  # an echoed prompt's first token
            out["text_offset"].append(self.offset)
            self.offset += len(e["token"])
        return out


def vllm_prompt_logprobs(entries) -> list:
    """vLLM's `prompt_logprobs` of a choice: None for the first token, then {token id: {logprob, rank,
    decoded_token}} for the token and the top n there."""
    out = []
    for e in entries:
        if e["logprob"] is None:
            out.append(None)
            continue
        d = {str(t["id"]): {"logprob": t["logprob"], "rank": t["rank"], "decoded_token": t["token"]}
             for t in e["top_logprobs"]}
        d[str(e["id"])] = {"logprob": e["logprob"], "rank": e["rank"], "decoded_token": e["token"]}
        out.append(d)
    return out


class Output:
    """Builds one request's bodies: `start`, `delta`, `finish` chunks for a stream, or `result`. A completion
    with `echo` starts with its prompt (and, with logprobs, the prompt tokens' logprobs; `max_tokens: 0`: only
    them); with vLLM's `prompt_logprobs` its choice carries them in vLLM's shape."""

    def __init__(self, body, rid: str, chat: bool, index: int = 0):
        self.rid, self.model, self.chat, self.body, self.index = rid, body.model, chat, body, index
        self.want_logprobs = bool(body.logprobs) if chat else body.logprobs is not None
        self.parse = chat  # every chat: tool calls, thought channels (a stray one too) and control tokens
        self.parser: ChatOutput | None = None
        self.logprobs = chat_logprobs if chat else CompletionLogprobs()
        self.echo = not chat and getattr(body, "echo", False)
        self.score_only = not chat and body.max_tokens == 0
        self.prompt_done = chat  # a completion's prompt part (echo, prompt_logprobs) goes out once

    def _prompt_part(self, ev) -> tuple[str, tuple, list | None]:
        """(echoed text, echoed logprob entries, vLLM's prompt_logprobs) on the request's first event."""
        if self.prompt_done:
            return "", (), None
        self.prompt_done = True
        entries = getattr(ev, "prompt_logprobs", ())
        text = ""
        if self.echo:
            text = self.body.prompt if isinstance(self.body.prompt, str) else "".join(e["token"] for e in entries)
        echoed = entries if self.echo and self.want_logprobs else ()
        vllm = vllm_prompt_logprobs(entries) if getattr(self.body, "prompt_logprobs", None) is not None else None
        return text, echoed, vllm

    def _completion_event(self, ev):
        """A completion's event with its prompt part in front (and, with max_tokens 0, nothing else)."""
        text, echoed, vllm = self._prompt_part(ev)
        gen_text, gen_lps = ("", ()) if self.score_only else (ev.text, ev.logprobs)
        return text + gen_text, (*echoed, *gen_lps), vllm

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
        if not self.chat:
            text, lps, vllm = self._completion_event(ev)
            lp = self.logprobs(lps) if self.want_logprobs and lps else None
            chunks = [self._chunk(text, None, lp)] if text or lp or vllm is not None else []
            if vllm is not None:
                chunks[0]["choices"][0]["prompt_logprobs"] = vllm
            return chunks
        lp = self.logprobs(ev.logprobs) if self.want_logprobs and ev.logprobs else None
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
        if not self.chat:
            text, lps, vllm = self._completion_event(ev)
            body = P.completion_response(self.rid, self.model, text, ev.finish_reason, ev.prompt_tokens,
                                         0 if self.score_only else ev.completion_tokens)
            body["choices"][0].update(index=self.index, logprobs=self.logprobs(lps) if self.want_logprobs else None)
            if vllm is not None:
                body["choices"][0]["prompt_logprobs"] = vllm
            return body
        lp = self.logprobs(ev.logprobs) if self.want_logprobs else None
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
        joined["usage"] = P.usage(events[0].prompt_tokens, self._generated(events))
        return joined

    def _generated(self, events: list[Finished]) -> int:
        """Completion tokens of every choice (none where max_tokens 0 only scored the prompt)."""
        return 0 if self.outs[0].score_only else sum(ev.completion_tokens for ev in events)

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
        tail = Delta(ev.text, (), ev.logprobs, prompt_logprobs=ev.prompt_logprobs)
        out = [sse(c) for c in o.delta(tail) + o.finish(ev)]
        self.finished[i] = ev
        if self.include_usage and len(self.finished) == len(self.outs):
            done = list(self.finished.values())
            out.append(sse({"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                            "model": self.model, "choices": [],
                            "usage": P.usage(done[0].prompt_tokens, self._generated(done))}))
        return out

    def fail(self, message: str, type_: str, param=None, code=None) -> list[str]:
        return [sse(P.error_body(message, type_, param, code))]

    def end(self) -> list[str]:
        return [sse("[DONE]")]


def sse(data: dict | str, event: str | None = None) -> str:
    body = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
    return f"event: {event}\n{body}" if event else body
