"""Incremental detokenization: emit the text each new token adds, never a half-decoded character.

Decodes only a short window (from `prefix` to the end) per token, as vLLM / TGI do, so the cost per
step does not grow with the output. Text ending in U+FFFD (an incomplete UTF-8 sequence) is held back
until the next token completes it. Ids in `drop` (the vocabulary's reserved `<unusedN>` tokens: no text
of a trained model, though random or confused weights emit them) never become text, even when special
tokens are kept for the output parsers.
"""

from __future__ import annotations

import re

UNUSED = re.compile(r"<unused\d+>\Z")


def unused_ids(tokenizer) -> frozenset[int]:
    """The ids of the vocabulary's reserved `<unusedN>` tokens (none for a tokenizer without a vocabulary)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return frozenset(i for t, i in vocab.items() if t.startswith("<unused") and UNUSED.match(t))


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True, drop: frozenset[int] = frozenset()):
        self.tok, self.skip, self.drop = tokenizer, skip_special_tokens, drop
        self.ids: list[int] = []
        self.prefix = 0  # start of the window whose text was already emitted up to `read`
        self.read = 0

    def _decode(self, ids: list[int]) -> str:
        if self.drop:
            ids = [i for i in ids if i not in self.drop]
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix: self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever text is still held back at the end of generation."""
        before = self._decode(self.ids[self.prefix: self.read])
        after = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]
