"""The output of one chat-shaped request as a sequence of typed blocks, for the APIs whose answers are lists of
parts (the Responses API's output items, Anthropic's content blocks): `reasoning`, `text` and `tool` (one function
call each). Built from `chat_output.ChatOutput`'s deltas, so thought channels, tool calls and control tokens are
parsed once, by the same parser as a chat completion; each API only renames what happens here.

`feed` / `flush` return events: ("open", block), ("delta", block, piece) and ("close", block). A block is a dict:
{"kind", "index", "text"} (reasoning, text) or {"kind": "tool", "index", "id", "name", "text": the arguments}.
"""

from __future__ import annotations

from serve_app.openai.chat_output import ChatOutput


class Blocks:
    @classmethod
    def for_chat(cls, chat, first) -> "Blocks":
        """The blocks of a chat request (`protocol.ChatRequest`), from its first event (a prompt that ends
        inside a thought channel starts the parser there)."""
        return cls(ChatOutput(chat.parsed_tools, chat.thinking, chat.parallel_tool_calls,
                              in_thought=getattr(first, "in_thought", False)))

    def __init__(self, parser: ChatOutput):
        self.parser = parser
        self.blocks: list[dict] = []
        self.open: dict | None = None

    def feed(self, text: str) -> list[tuple]:
        return self._events(self.parser.feed(text)) if text else []

    def flush(self) -> list[tuple]:
        events = self._events(self.parser.flush())
        if self.open is not None:
            events.append(("close", self.open))
            self.open = None
        return events

    def finish_reason(self, reason: str) -> str:
        """stop | length | tool_calls (the parser's, as for a chat completion)."""
        return self.parser.finish_reason(reason)

    def _events(self, deltas: list[dict]) -> list[tuple]:
        out: list[tuple] = []
        for d in deltas:
            if d.get("reasoning_content"):
                self._append("reasoning", d["reasoning_content"], out)
            if d.get("content"):
                self._append("text", d["content"], out)
            for call in d.get("tool_calls") or ():
                if call.get("id"):
                    self._start({"kind": "tool", "id": call["id"], "name": call["function"]["name"]}, out)
                piece = (call.get("function") or {}).get("arguments") or ""
                if piece and self.open is not None and self.open["kind"] == "tool":
                    self.open["text"] += piece
                    out.append(("delta", self.open, piece))
        return out

    def _append(self, kind: str, piece: str, out: list) -> None:
        if self.open is None or self.open["kind"] != kind:
            self._start({"kind": kind}, out)
        self.open["text"] += piece
        out.append(("delta", self.open, piece))

    def _start(self, block: dict, out: list) -> None:
        if self.open is not None:
            out.append(("close", self.open))
        self.open = {**block, "index": len(self.blocks), "text": ""}
        self.blocks.append(self.open)
        out.append(("open", self.open))
