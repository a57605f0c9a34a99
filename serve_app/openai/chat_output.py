"""A chat completion's output, from the replica's raw text (control tokens kept when the request has tools
or thinking) to OpenAI's message / stream deltas: thought channels -> `reasoning_content`, Gemma-4 tool
calls -> `tool_calls` (finish_reason "tool_calls"), control tokens removed from `content`.

One streaming pipeline serves both forms, so a stream and a non-stream answer always agree.
"""

from __future__ import annotations

from serve_app.openai.reasoning import ReasoningParser
from serve_app.openai.tool_parsers.gemma4 import Gemma4ToolParser


class ChatOutput:
    def __init__(self, tool_names=None, thinking: bool = False, parallel_tool_calls: bool = True):
        self.reasoning = ReasoningParser() if thinking else None
        self.tools = Gemma4ToolParser(tool_names, max_calls=None if parallel_tool_calls else 1)
        self.content: list[str] = []
        self.thoughts: list[str] = []

    def feed(self, text: str) -> list[dict]:
        """OpenAI deltas for one more piece of raw text."""
        if self.reasoning is None:
            return self._keep(self.tools.feed(text))
        thought, rest = self.reasoning.feed(text)
        return self._keep(([{"reasoning_content": thought}] if thought else []) + self.tools.feed(rest))

    def flush(self) -> list[dict]:
        out = []
        if self.reasoning is not None:
            thought, rest = self.reasoning.flush()
            out += ([{"reasoning_content": thought}] if thought else []) + self.tools.feed(rest)
        return self._keep(out + self.tools.flush())

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.tools.calls and reason == "stop" else reason

    def message(self) -> dict:
        """The whole message (call after `flush`)."""
        calls = self.tools.calls
        msg = {"role": "assistant", "content": "".join(self.content) or (None if calls else "")}
        if calls:
            msg["tool_calls"] = calls
        if self.reasoning is not None:
            msg["reasoning_content"] = "".join(self.thoughts) or None
        return msg

    def _keep(self, deltas: list[dict]) -> list[dict]:
        for d in deltas:
            if "content" in d:
                self.content.append(d["content"])
            if "reasoning_content" in d:
                self.thoughts.append(d["reasoning_content"])
        return deltas
