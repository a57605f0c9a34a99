"""Gemma-4 thinking: `<|channel>thought\n...<channel|>` in the output is reasoning, never content.

`ReasoningParser` is streaming (chunks split anywhere): `feed(text)` returns (reasoning, rest), where rest is
the text outside thought channels, for the tool-call parser. Only used when the request turned thinking on.
"""

from __future__ import annotations

from serve_app.openai.tool_parsers.markers import Splitter

OPEN, CLOSE, HEAD = "<|channel>", "<channel|>", "thought\n"


class ReasoningParser:
    def __init__(self):
        self.split = Splitter((OPEN, CLOSE))
        self.inside = False
        self.head: str | None = None  # the start of a channel, until we know whether it is `thought\n`

    def feed(self, text: str) -> tuple[str, str]:
        return self._run(self.split.feed(text))

    def flush(self) -> tuple[str, str]:
        reasoning, rest = self._run(self.split.flush())
        if self.head is not None:
            reasoning, self.head = reasoning + self.head, None
        return reasoning, rest

    def _run(self, pieces) -> tuple[str, str]:
        reasoning, rest = [], []
        for marker, s in pieces:
            if marker:
                if self.head is not None:
                    reasoning.append(self.head)
                    self.head = None
                self.inside = s == OPEN
                if self.inside:
                    self.head = ""
            elif not self.inside:
                rest.append(s)
            elif self.head is not None:
                self.head += s
                if len(self.head) >= len(HEAD) or not HEAD.startswith(self.head):
                    reasoning.append(self.head.removeprefix(HEAD))
                    self.head = None
            else:
                reasoning.append(s)
        return "".join(reasoning), "".join(rest)
