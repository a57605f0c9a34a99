"""Gemma-4 tool calls: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,ok:true,o:{...},a:[...]}<tool_call|>`
(bare keys, strings between `<|"|>`), several in a row, -> OpenAI tool calls with JSON `arguments`.

`read_call(body, final)` reads one call's body (between the markers; arguments read by `gemma4_args`, leniently,
always valid JSON); `parse_call(body)` is the same for a closed call, raising `CallSyntaxError` when the body names
no call. `Gemma4ToolParser` is the streaming form: feed text chunks split anywhere, get OpenAI deltas, the same
whatever the chunking. A call is emitted when it ends: a first delta with `index`, `id`, `type` and
`function.name`, then one with the whole `arguments`.

What reaches `content`: the text outside calls, control tokens removed, whitespace next to a call trimmed (as
ollama does). Call markup never does. A call is returned under the name the model wrote, listed in `tools` or
not (vLLM and ollama do the same; the templates render any name back in the history); it is dropped when the
request has no tools (or `tool_choice: "none"`), when `parallel_tool_calls: false` already has its call, or when
it names nothing (`<|tool_call>oops<tool_call|>`). A call the text ends inside (max_tokens) is returned when its
name is complete, holding the values the model finished (`gemma4_args`); finish_reason stays "length".
"""

from __future__ import annotations

import json
import re
import uuid

from serve_app.openai.tool_parsers.gemma4_args import QUOTE, read_object
from serve_app.openai.tool_parsers.markers import CONTROL, Splitter, Trim

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
_NAME = re.compile(r"[\w.\-]+")

__all__ = ["OPEN", "CLOSE", "QUOTE", "CallSyntaxError", "Gemma4ToolParser", "merge_deltas", "parse_call",
           "read_call"]


class CallSyntaxError(ValueError):
    pass


def read_call(body: str, final: bool = True) -> tuple[str, dict] | None:
    """`call:NAME{...}` -> (NAME, arguments), or None when the body names no call. `final`: closed by its
    marker; otherwise the text ended inside it."""
    try:
        body = body.lstrip()
        if not body.startswith("call:"):
            return None
        brace = body.find("{")
        name = (body[5:brace] if brace >= 0 else body[5:]).strip()
        if brace < 0:  # `call:ping` closed with no arguments at all
            return (name, {}) if final and _NAME.fullmatch(name) else None
        return (name, read_object(body, brace, final)) if name else None
    except Exception:  # noqa: BLE001 - model output never raises; nothing readable is no call
        return None


def parse_call(body: str) -> tuple[str, dict]:
    """A closed call's body -> (NAME, arguments)."""
    got = read_call(body, final=True)
    if got is None:
        raise CallSyntaxError(f"expected call:NAME{{...}}, got {body[:40]!r}")
    return got


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class Gemma4ToolParser:
    """Streaming: `feed(text)` and finally `flush()` return OpenAI deltas ({"content": ...} or
    {"tool_calls": [...]}); `calls` holds the returned calls in OpenAI's message shape."""

    def __init__(self, tool_names=None, strip=CONTROL, max_calls: int | None = None):
        self.names, self.max_calls = set(tool_names or ()), max_calls  # max_calls 1: parallel_tool_calls false
        self.split = Splitter(set(strip) | {OPEN, CLOSE})
        self.body: str | None = None  # inside a call: its text so far
        self.trim = Trim()
        self.calls: list[dict] = []

    def feed(self, text: str) -> list[dict]:
        return merge_deltas(self._run(self.split.feed(text)))

    def flush(self) -> list[dict]:
        out = self._run(self.split.flush())
        if self.body is not None:  # the text ended inside a call
            out += self._end(final=False)
        out.append({"content": self.trim.release()})
        return merge_deltas(out)

    def _run(self, pieces) -> list[dict]:
        out = []
        for marker, s in pieces:
            if self.body is not None:
                if not marker or s == QUOTE:
                    self.body += s
                    continue
                out += self._end(final=s == CLOSE)  # closed, or another marker began: cut
                if s == CLOSE:
                    continue
            if marker and s == OPEN:
                self.trim.cut()  # whitespace before a call is not content
                self.body = ""
            elif not marker:
                out.append({"content": self.trim.text(s)})
            # any other marker: control markup, removed
        return out

    def _end(self, final: bool) -> list[dict]:
        body, self.body = self.body, None
        self.trim.cut(lead=True)  # nor is whitespace after it
        got = read_call(body, final)
        if got is None or not self.names or self.max_calls is not None and len(self.calls) >= self.max_calls:
            return []
        name, args = got
        call = {"id": new_call_id(), "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
        index = len(self.calls)
        self.calls.append(call)
        return [{"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                 "function": {"name": name, "arguments": ""}}]},
                {"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}]


def merge_deltas(deltas: list[dict]) -> list[dict]:
    """Adjacent content (or reasoning_content) deltas as one; empty ones dropped."""
    out: list[dict] = []
    for d in deltas:
        if len(d) == 1 and ("content" in d or "reasoning_content" in d):
            if not next(iter(d.values())):
                continue
            if out and set(out[-1]) == set(d):
                key = next(iter(d))
                out[-1] = {key: out[-1][key] + d[key]}
                continue
        out.append(d)
    return out
