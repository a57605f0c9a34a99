"""Gemma-4 call arguments -> Python values that always serialise to valid JSON; never raises on model output.

The syntax the templates render and the model writes: `{key:<|"|>text<|"|>,n:42,ok:true,o:{...},a:[...]}`, bare
keys, strings between `<|"|>` taken verbatim (no escapes). Read leniently, as vLLM's and ollama's Gemma-4 parsers
do: JSON-style `"key":"v"` (models write it; our grammars no longer do), `<|"|>`-quoted
keys, `None`/`null`/`nil` (the 04-01 and April templates render null as `None`), `True`/`False`, trailing and
doubled commas, `.5`, `5.`, `+5`, single-quoted strings, a stray `<|"|>` after a value, bare strings (up to a
comma that starts the next `key:`, so prose with commas survives), a string left open before the closing braces.
Numbers that are not finite in JSON (`1e999`) and integers with leading zeros (`007`) stay strings, as written.

`final`: the call was closed by its marker, so whatever stands is what the model meant. Otherwise the text was
cut (max_tokens, the stream ended): a value the model had not finished (a string, number or key running to the
end) is left out, and open objects and arrays are closed around the members that were finished.
"""

from __future__ import annotations

import json
import math
import re

QUOTE = '<|"|>'
MAX_DEPTH = 64  # deeper containers are read as bare text: no recursion limit for any input
_JSON = json.JSONDecoder(strict=False)
_WS = " \t\r\n"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None, "none": None, "nil": None}
_SCALAR = re.compile(r"(?:[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|true|false|null|none|nil)"
                     r'(?=\s*(?:[,}\]]|<\|"\|>|$))', re.IGNORECASE)
_BARE_KEY = re.compile(r"[^,{}\[\]:]*")
# after a comma in an object: the next member's key (or the object's end), so the comma ends a bare string
_NEXT_KEY = re.compile(r'\s*(?:<\|"\|>(?:(?!<\|"\|>).)*<\|"\|>|"(?:[^"\\\n]|\\.)*"|[^\s,{}\[\]:"\'<>]+)\s*:|\s*[}\]]',
                       re.DOTALL)


class Cut(Exception):
    """The text ended inside a value the model had not finished."""


def scalar(token: str):
    """A bare token -> bool, None, int, float or the text itself."""
    t = token.strip()
    if t.lower() in _LITERALS:
        return _LITERALS[t.lower()]
    if _NUMBER.fullmatch(t):
        digits = t.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
            return t  # `007`, a zip code: kept as written
        try:
            if not any(c in t for c in ".eE"):
                return int(t)
            f = float(t)
        except ValueError:  # an integer too long for int()
            return t
        return f if math.isfinite(f) else t
    return token.lstrip(" \t").rstrip()


class Reader:
    def __init__(self, s: str, final: bool):
        self.s, self.n, self.final = s, len(s), final

    def skip(self, i: int, chars: str = _WS) -> int:
        while i < self.n and self.s[i] in chars:
            i += 1
        return i

    def container(self, i: int, depth: int, keyed: bool):
        """s[i] is `{` or `[`: (the object or list, the index after it)."""
        s, out = self.s, {} if keyed else []
        i += 1
        try:
            while True:
                i = self.skip(i, _WS + ",")
                if i >= self.n:
                    return out, self.n  # never closed: the marker closed it, or the text was cut
                if s[i] in "}]":
                    return out, i + 1  # its own closer, or a mismatched one: lenient
                if keyed:
                    key, i = self.key(i)
                    if key is None:
                        i = self.junk(i)
                        continue
                    out[key], i = self.value(i, depth, keyed)
                else:
                    v, i = self.value(i, depth, keyed)
                    out.append(v)
                i = self.after(i)
        except Cut:
            return out, self.n

    def key(self, i: int):
        s = self.s
        if s.startswith(QUOTE, i):
            end = s.find(QUOTE, i + len(QUOTE))
            if end < 0:
                return self._end_of_text()
            k, i = s[i + len(QUOTE):end], end + len(QUOTE)
        elif s[i] == '"':
            try:
                k, i = _JSON.raw_decode(s, i)
            except json.JSONDecodeError:
                return None, i
        else:
            m = _BARE_KEY.match(s, i)
            k, i = m.group().strip(), m.end()
        i = self.skip(i)
        if i >= self.n:
            return self._end_of_text()
        return (k, i + 1) if s[i] == ":" else (None, i)

    def _end_of_text(self):
        if not self.final:
            raise Cut
        return None, self.n

    def value(self, i: int, depth: int, in_object: bool):
        s, j = self.s, self.skip(i)
        if j >= self.n:
            if not self.final:
                raise Cut
            return "", self.n  # `key:` and nothing more: an empty value, as vLLM reads it
        if s.startswith(QUOTE, j):
            end = s.find(QUOTE, j + len(QUOTE))
            if end < 0:
                return self.unterminated(j + len(QUOTE), depth)
            return s[j + len(QUOTE):end], end + len(QUOTE)
        c = s[j]
        if c in "{[" and depth < MAX_DEPTH:
            return self.container(j, depth + 1, keyed=c == "{")
        if c == '"':
            return self.json_string(j, depth)
        if c == "'":
            got = self.single_quoted(j)
            if got is not None:
                return got
        m = _SCALAR.match(s, j)
        if m:
            if m.end() >= self.n and not self.final:
                raise Cut  # `4` may be the start of `42`, `tru` of `true`
            return scalar(m.group()), m.end()
        return self.bare(i, in_object)

    def bare(self, i: int, in_object: bool):
        """Unquoted text: up to its container's closer or a comma that starts the next member."""
        s, j, nest = self.s, i, 0
        while j < self.n:
            c = s[j]
            if c in "{[":
                nest += 1
            elif c in "}]":
                if nest == 0:
                    break
                nest -= 1
            elif c == "," and nest == 0 and (not in_object or _NEXT_KEY.match(s, j + 1)):
                break
            j += 1
        if j >= self.n and not self.final:
            raise Cut
        return scalar(s[i:j]), j

    def json_string(self, j: int, depth: int):
        try:
            return _JSON.raw_decode(self.s, j)
        except json.JSONDecodeError:
            pass
        k = j + 1
        while k < self.n:  # bad escapes (`"C:\users"`): the raw text up to the closing quote
            if self.s[k] == "\\":
                k += 2
            elif self.s[k] == '"':
                return self.s[j + 1:k].replace('\\"', '"'), k + 1
            else:
                k += 1
        return self.unterminated(j + 1, depth)

    def single_quoted(self, j: int):
        """`'text'` (ollama's repair): up to the first unescaped `'`, which must end the value."""
        s, k = self.s, j + 1
        while (k := s.find("'", k)) > 0 and s[k - 1] == "\\":
            k += 1
        if k < 0:
            return None
        e = self.skip(k + 1)
        if s.startswith(QUOTE, e):
            e = self.skip(e + len(QUOTE))
        return (s[j + 1:k], k + 1) if e >= self.n or s[e] in ",}]" else None

    def unterminated(self, start: int, depth: int):
        """A string never closed: cut, or (final) its text up to the closers that end the call."""
        if not self.final:
            raise Cut
        t = self.s[start:]
        for _ in range(depth):
            u = t.rstrip()
            if not u.endswith(("}", "]")):
                break
            t = u[:-1]
        return t, self.n

    def after(self, i: int) -> int:
        """Past what follows a value: whitespace, a stray closing `<|"|>`, anything else up to `,` or a closer."""
        i = self.skip(i)
        if self.s.startswith(QUOTE, i):
            e = self.skip(i + len(QUOTE))
            if e >= self.n or self.s[e] in ",}]":
                i = e
        if i < self.n and self.s[i] not in ",}]" and not _NEXT_KEY.match(self.s, i):
            i = self.junk(i)  # a next `key:` without its comma is read as the next member
        return i

    def junk(self, i: int) -> int:
        s = self.s
        while i < self.n:
            if s.startswith(QUOTE, i):
                end = s.find(QUOTE, i + len(QUOTE))
                i = self.n if end < 0 else end + len(QUOTE)
            elif s[i] in ",}]":
                return i
            else:
                i += 1
        return i


def read_object(s: str, brace: int, final: bool) -> dict:
    """The object starting at s[brace] (`{`)."""
    args, _ = Reader(s, final).container(brace, 1, keyed=True)
    return args
