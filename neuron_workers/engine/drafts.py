"""Prompt-lookup drafts (vLLM's `ngram` method): a sequence's next tokens guessed from its own history.

The drafter looks up the last n tokens of the sequence (n from `n_max` down to `n_min`) where they occurred
before in its prompt and output and proposes the up to k tokens that followed them there: after the latest
occurrence when k tokens follow it, else after the first (a run of one repeated token has its latest
occurrence right behind the tail). No model: it pays off where the text quotes its context (code edits, JSON,
agents repeating a tool result, a model caught in a loop). Each sequence keeps an index of its n-grams (their
first and latest end before the last token), grown as tokens come, so a proposal costs O(new tokens), not
O(history). Pure host logic.
"""

from __future__ import annotations

NGRAM_MAX, NGRAM_MIN = 4, 1


class NgramIndex:
    """First and latest end (exclusive) of every n-gram of a token list, n in [n_min, n_max], among the
    n-grams that end before its last token (so a match always has a continuation)."""

    def __init__(self, n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX):
        self.n_min, self.n_max = n_min, n_max
        self.ends: dict[tuple[int, ...], tuple[int, int]] = {}
        self.indexed = 0  # n-grams ending at positions < indexed are in `ends`

    def grow(self, tokens: list[int]) -> None:
        for end in range(max(self.indexed, 1), len(tokens)):  # n-grams ending before the last token
            for n in range(self.n_min, self.n_max + 1):
                if end >= n:
                    gram = tuple(tokens[end - n:end])
                    self.ends[gram] = (self.ends.get(gram, (end,))[0], end)
        self.indexed = max(self.indexed, len(tokens))

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest recent match of the history's tail."""
        self.grow(tokens)
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(tokens) > n:
                ends = self.ends.get(tuple(tokens[-n:]))
                if ends is not None:
                    end = ends[1] if len(tokens) - ends[1] >= k else ends[0]
                    return tokens[end:end + k]
        return []


class PromptLookup:
    """The `ngram` drafter: each sequence's own `NgramIndex` (kept on the sequence)."""

    def propose(self, seq, k: int) -> list[int]:
        if seq.ngrams is None:
            seq.ngrams = NgramIndex()
        return seq.ngrams.propose(seq.prompt_ids + seq.output_ids, k)
