"""A drafter for tests of speculative decoding: drafts from the known greedy continuation of each prompt,
right for 0, 1, ..., k tokens in turn and then wrong, so every acceptance length is exercised."""

from __future__ import annotations


class Oracle:
    def __init__(self, want: dict[tuple, list[int]], vocab: int):
        self.want, self.vocab, self.calls = want, vocab, 0

    def propose(self, seq, k):
        ref = self.want[tuple(seq.prompt_ids)][len(seq.output_ids):][:k]
        self.calls += 1
        good = self.calls % (k + 1)
        return ref[:good] + [(t + 1) % self.vocab for t in ref[good:]]
