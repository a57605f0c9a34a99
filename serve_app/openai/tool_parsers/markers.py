"""Split a text stream into plain text and marker strings (control tokens), whatever the chunking: a tail
that could start a marker is held back until the next chunk (or `flush`) decides."""

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
        keep = max((n for m in self.markers for n in range(min(len(m) - 1, len(s)), 0, -1)
                    if s.endswith(m[:n])), default=0)
        self.held = s[len(s) - keep:] if keep else ""
        if len(s) > keep:
            out.append((False, s[:len(s) - keep]))
        return out

    def flush(self) -> list[tuple[bool, str]]:
        out, self.held = [(False, self.held)] if self.held else [], ""
        return out
