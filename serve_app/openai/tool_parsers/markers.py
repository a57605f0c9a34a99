"""Marker-level streaming helpers shared by the output parsers, each the same whatever the chunking:
`Splitter` splits a text stream into plain text and marker strings (control tokens), holding back a tail that
could start a marker until the next chunk (or `flush`) decides; `Trim` decides the whitespace at the edges of a
span (an answer around tool calls, a thought) as the text arrives."""

from __future__ import annotations

import re

# Gemma-4's control tokens as the detokenizer writes them (special tokens kept)
CONTROL = ("<eos>", "<pad>", "<bos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
           "<|tool_response>", "<tool_response|>", '<|"|>', "<|think|>", "<|channel>", "<channel|>", "<|image>",
           "<image|>", "<|audio>", "<audio|>", "<|image|>", "<|audio|>", "<|video|>")


class Splitter:
    def __init__(self, markers):
        self.markers = tuple(sorted(set(markers), key=len, reverse=True))
        # one pass over the text: leftmost match, the longest marker first at a position
        self.pattern = re.compile("|".join(map(re.escape, self.markers)))
        self.longest = len(self.markers[0])
        self.firsts = {m[0] for m in self.markers}
        self.held = ""

    def feed(self, text: str) -> list[tuple[bool, str]]:
        """[(is_marker, piece)] for what `text` (after what was held) settles."""
        s, out, pos = self.held + text, [], 0
        for m in self.pattern.finditer(s):
            if m.start() > pos:
                out.append((False, s[pos:m.start()]))
            out.append((True, m.group()))
            pos = m.end()
        s = s[pos:]
        keep = 0
        if not self.firsts.isdisjoint(s[-self.longest:]):  # else no tail can start a marker
            keep = max((n for m in self.markers for n in range(min(len(m) - 1, len(s)), 0, -1)
                        if s.endswith(m[:n])), default=0)
        self.held = s[len(s) - keep:] if keep else ""
        if len(s) > keep:
            out.append((False, s[:len(s) - keep]))
        return out

    def flush(self) -> list[tuple[bool, str]]:
        out, self.held = [(False, self.held)] if self.held else [], ""
        return out


class Trim:
    """One span's edges: with `lead` set, the span's leading whitespace is dropped; trailing whitespace is held
    until more text shows it is inside the span (`text`), the span ends (`cut`: dropped) or the stream ends
    (`release`: kept)."""

    def __init__(self, lead: bool = False):
        self.lead, self.held = lead, ""

    def text(self, s: str) -> str:
        if self.lead:
            s = s.lstrip()
            if not s:
                return ""
            self.lead = False
        core = s.rstrip()
        if not core:
            self.held += s
            return ""
        out, self.held = self.held + core, s[len(core):]
        return out

    def cut(self, lead: bool = False) -> None:
        self.held, self.lead = "", lead

    def release(self) -> str:
        out, self.held = self.held, ""
        return out
