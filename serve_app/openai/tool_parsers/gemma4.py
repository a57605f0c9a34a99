"""Gemma-4 tool calls: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,ok:true,o:{...},a:[...]}<tool_call|>`
(bare keys, strings between `<|"|>`), several in a row, -> OpenAI tool calls with JSON `arguments`.

`parse_call(body)` reads one call's body (between the markers); JSON-style keys and strings (`"key":"v"`,
what `serve_app.openai.constraints` generates for schemas without a native grammar) are read as well.
`Gemma4ToolParser` is the streaming form: feed text chunks split anywhere, get OpenAI deltas. A call is
emitted when its closing marker arrives: a first delta with `index`, `id`, `type` and `function.name`,
then one with the `arguments`. Text outside calls stays content (other control tokens removed); a call
that does not parse, names an unknown tool or never closes comes back as content, markers and all.
"""

from __future__ import annotations

import json
import re
import uuid

from serve_app.openai.tool_parsers.markers import CONTROL, Splitter

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
_JSON = json.JSONDecoder()


class CallSyntaxError(ValueError):
    pass


def parse_call(body: str) -> tuple[str, dict]:
    """`call:NAME{...}` -> (NAME, arguments)."""
    if not body.startswith("call:") or "{" not in body:
        raise CallSyntaxError("expected call:NAME{...}")
    brace = body.index("{")
    name = body[5:brace].strip()
    if not name:
        raise CallSyntaxError("the call has no name")
    args, end = _Reader(body).value(brace)
    if body[end:].strip() or not isinstance(args, dict):
        raise CallSyntaxError("the arguments are not one object")
    return name, args


class _Reader:
    def __init__(self, s: str):
        self.s = s

    def ws(self, i: int) -> int:
        while i < len(self.s) and self.s[i] in " \t\r\n":
            i += 1
        return i

    def value(self, i: int):
        s, i = self.s, self.ws(i)
        if s.startswith(QUOTE, i):
            end = s.find(QUOTE, i + len(QUOTE))
            if end < 0:
                raise CallSyntaxError("unterminated string")
            return s[i + len(QUOTE):end], end + len(QUOTE)
        if s.startswith('"', i):
            try:
                return _JSON.raw_decode(s, i)
            except json.JSONDecodeError as e:
                raise CallSyntaxError(str(e)) from None
        if s.startswith("{", i):
            return self.container(i, "}", keyed=True)
        if s.startswith("[", i):
            return self.container(i, "]", keyed=False)
        for word, v in (("true", True), ("false", False), ("null", None)):
            if s.startswith(word, i):
                return v, i + len(word)
        m = _NUMBER.match(s, i)
        if m:
            return json.loads(m.group()), m.end()
        raise CallSyntaxError(f"unexpected {s[i:i + 10]!r}")

    def key(self, i: int) -> tuple[str, int]:
        s, i = self.s, self.ws(i)
        if s.startswith(QUOTE, i) or s.startswith('"', i):
            k, i = self.value(i)
            i = self.ws(i)
        else:
            j = s.find(":", i)
            if j < 0:
                raise CallSyntaxError("a key without a value")
            k, i = s[i:j].strip(), j
            if not k or any(c in k for c in '{}[],"<'):
                raise CallSyntaxError(f"bad key {k!r}")
        if not s.startswith(":", i):
            raise CallSyntaxError("expected ':' after a key")
        return k, i + 1

    def container(self, i: int, close: str, keyed: bool):
        s, out, i = self.s, {} if keyed else [], self.ws(i + 1)
        if s.startswith(close, i):
            return out, i + 1
        while True:
            if keyed:
                k, i = self.key(i)
                out[k], i = self.value(i)
            else:
                v, i = self.value(i)
                out.append(v)
            i = self.ws(i)
            if s.startswith(",", i):
                i += 1
            elif s.startswith(close, i):
                return out, i + 1
            else:
                raise CallSyntaxError(f"expected ',' or {close!r}")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class Gemma4ToolParser:
    """Streaming: `feed(text)` and finally `flush()` return OpenAI deltas ({"content": ...} or
    {"tool_calls": [...]}); `calls` holds the finished calls in OpenAI's message shape."""

    def __init__(self, tool_names=None, strip=CONTROL, max_calls: int | None = None):
        self.names, self.max_calls = set(tool_names or ()), max_calls  # max_calls 1: parallel_tool_calls false
        markers = set(strip) | ({OPEN, CLOSE} if self.names else set())
        self.split = Splitter(markers)
        self.strip = set(strip) | {CLOSE}
        self.body: str | None = None  # inside a call: its text so far
        self.calls: list[dict] = []

    def feed(self, text: str) -> list[dict]:
        return self._run(self.split.feed(text))

    def flush(self) -> list[dict]:
        out = self._run(self.split.flush())
        if self.body is not None:  # a call that never closed: the text it was
            out.append({"content": OPEN + self.body})
            self.body = None
        return _merge(out)

    def _run(self, pieces) -> list[dict]:
        out = []
        for marker, s in pieces:
            if self.body is not None:
                if not marker or s == QUOTE:
                    self.body += s
                    continue
                if s == CLOSE:
                    out += self._close(self.body)
                    self.body = None
                    continue
                out.append({"content": OPEN + self.body})  # unterminated, something else began
                self.body = None
            if marker and s == OPEN and self.names:
                self.body = ""
            elif not marker or s not in self.strip:
                out.append({"content": s})
        return _merge(out)

    def _close(self, body: str) -> list[dict]:
        try:
            name, args = parse_call(body)
        except CallSyntaxError:
            return [{"content": OPEN + body + CLOSE}]
        if name not in self.names or self.max_calls is not None and len(self.calls) >= self.max_calls:
            return [{"content": OPEN + body + CLOSE}]  # not a call we may return: kept as text, never dropped
        call = {"id": new_call_id(), "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
        index = len(self.calls)
        self.calls.append(call)
        return [{"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                 "function": {"name": name, "arguments": ""}}]},
                {"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}]


def _merge(deltas: list[dict]) -> list[dict]:
    """Adjacent content deltas as one; empty ones dropped."""
    out: list[dict] = []
    for d in deltas:
        if "content" in d:
            if not d["content"]:
                continue
            if out and set(out[-1]) == {"content"}:
                out[-1] = {"content": out[-1]["content"] + d["content"]}
                continue
        out.append(d)
    return out
