"""Stop strings over a stream of text pieces: emit text as soon as it cannot be the start of a stop
string, and cut the output at the first stop string (which is not included, as in OpenAI's API)."""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit = False
        self.matched: str | None = None  # the stop string that ended the output (the first one in the text)

    def feed(self, text: str) -> str:
        """Add generated text; return what is safe to send now. Sets `hit` on a stop string."""
        if not self.stops:
            return text
        self.held += text
        found = [(i, s) for i, s in ((self.held.find(s), s) for s in self.stops) if i >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            out, self.held, self.hit = self.held[:cut], "", True
            return out
        keep = max((self._overlap(s) for s in self.stops), default=0)
        out = self.held[: len(self.held) - keep]
        self.held = self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out

    def _overlap(self, stop: str) -> int:
        """Length of the longest tail of `held` that is a proper prefix of `stop`."""
        for n in range(min(len(stop) - 1, len(self.held)), 0, -1):
            if self.held.endswith(stop[:n]):
                return n
        return 0
