"""A chat completion's output, from the replica's raw text (control tokens kept when the request has tools
or thinking) to OpenAI's message / stream deltas: thought channels -> `reasoning_content` (dropped when thinking
is off), Gemma-4 tool calls -> `tool_calls` (finish_reason "tool_calls"), control tokens removed from `content`.

One streaming pipeline (`reasoning.ReasoningParser`, then `tool_parsers.gemma4.Gemma4ToolParser`) serves both
forms, so a stream and a non-stream answer always agree, however the text was chunked. `in_thought`: the
rendered prompt ended inside a thought channel (`<|channel>thought\n`), so the output starts as reasoning.
"""

from __future__ import annotations

from serve_app.openai.reasoning import ReasoningParser
from serve_app.openai.tool_parsers.gemma4 import Gemma4ToolParser, merge_deltas


class ChatOutput:
    def __init__(self, tool_names=None, thinking: bool = False, parallel_tool_calls: bool = True,
                 in_thought: bool = False):
        self.thinking = thinking
        self.reasoning = ReasoningParser(keep=thinking, in_thought=in_thought)
        self.tools = Gemma4ToolParser(tool_names, max_calls=None if parallel_tool_calls else 1)
        self.content: list[str] = []
        self.thoughts: list[str] = []

    def feed(self, text: str) -> list[dict]:
        """OpenAI deltas for one more piece of raw text."""
        return self._keep(self._route(self.reasoning.feed(text)))

    def flush(self) -> list[dict]:
        return self._keep(self._route(self.reasoning.flush()) + self.tools.flush())

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.tools.calls and reason == "stop" else reason

    def message(self) -> dict:
        """The whole message (call after `flush`)."""
        calls = self.tools.calls
        msg = {"role": "assistant", "content": "".join(self.content) or (None if calls else "")}
        if calls:
            msg["tool_calls"] = calls
        if self.thinking:
            msg["reasoning_content"] = "".join(self.thoughts) or None
        return msg

    def _route(self, pieces) -> list[dict]:
        out: list[dict] = []
        for kind, s in pieces:
            out += [{"reasoning_content": s}] if kind == "reasoning" else self.tools.feed(s)
        return out

    def _keep(self, deltas: list[dict]) -> list[dict]:
        deltas = merge_deltas(deltas)
        for d in deltas:
            if "content" in d:
                self.content.append(d["content"])
            if "reasoning_content" in d:
                self.thoughts.append(d["reasoning_content"])
        return deltas
