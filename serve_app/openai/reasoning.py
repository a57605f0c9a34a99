"""Gemma-4 thinking: thought channels (`<|channel>thought\n...<channel|>`) in the output are reasoning, never
content, whether the request turned thinking on (`keep`: the reasoning is returned) or off (it is dropped: the
26B/31B templates open an empty thought channel when thinking is off, and models write one anyway).

`ReasoningParser` is streaming (chunks split anywhere, the same result however split): `feed(text)` returns
ordered pieces [("reasoning" | "text", str)]; "text" is everything outside thoughts, for the tool-call parser.
- `in_thought`: the rendered prompt ended inside a thought channel (the 07-09 template, thinking on, after a tool
  response, ends with `<|channel>thought\n`): the output starts as reasoning, up to `<channel|>`.
- The `thought\n` label after `<|channel>` is removed, and a stray one at the very start of the output (vLLM's
  `gemma4_utils` does the same: models write it with thinking off too).
- A thought ends at `<channel|>`, or at `<|tool_call>` (a call ends the thought, as in vLLM), or with the text.
  Whitespace at a thought's edges and at the start of the answer after it is trimmed (as ollama does); other
  control tokens inside a thought are dropped. A stray `<channel|>` outside a thought is dropped.
"""

from __future__ import annotations

from serve_app.openai.tool_parsers.markers import CONTROL, Splitter, Trim

OPEN, CLOSE, HEAD, CALL = "<|channel>", "<channel|>", "thought\n", "<|tool_call>"


class ReasoningParser:
    def __init__(self, keep: bool = True, in_thought: bool = False):
        self.keep = keep
        self.split = Splitter(set(CONTROL) | {OPEN, CLOSE})
        self.inside = in_thought
        self.label: str | None = None if in_thought else ""  # text that may yet be the `thought\n` label
        self.thought = Trim(lead=True)  # the current thought's edges
        self.lead = False  # the answer right after a thought: its leading whitespace goes

    def feed(self, text: str) -> list[tuple[str, str]]:
        return self._run(self.split.feed(text))

    def flush(self) -> list[tuple[str, str]]:
        out = self._run(self.split.flush())
        self._unlabel(out)
        self.thought.cut()  # a thought cut by the end of the text: its trailing whitespace goes
        return _merge(out)

    def _run(self, pieces) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for marker, s in pieces:
            if not marker:
                if self.label is not None:
                    self.label += s
                    if self.label.startswith(HEAD):
                        s, self.label = self.label[len(HEAD):], None
                    elif HEAD.startswith(self.label):
                        continue
                    else:
                        s, self.label = self.label, None
                self._text(s, out)
                continue
            self._unlabel(out)
            if s == OPEN:
                self.inside, self.label = True, ""
                self.thought.cut(lead=True)
            elif self.inside and s in (CLOSE, CALL):
                self.inside, self.lead = False, s == CLOSE
                self.thought.cut()
                if s == CALL:
                    out.append(("text", s))
            elif not self.inside and s != CLOSE:
                self.lead = False
                out.append(("text", s))  # markers for the tool-call parser (control ones it removes)
        return _merge(out)

    def _unlabel(self, out) -> None:
        """What was held as a possible label is text after all."""
        if self.label is not None:
            s, self.label = self.label, None
            self._text(s, out)

    def _text(self, s: str, out) -> None:
        if self.inside:
            s = self.thought.text(s)
            if s and self.keep:
                out.append(("reasoning", s))
            return
        if self.lead:
            s = s.lstrip()
            self.lead = not s
        if s:
            out.append(("text", s))


def _merge(pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind, s in pieces:
        if not s:
            continue
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + s)
        else:
            out.append((kind, s))
    return out
