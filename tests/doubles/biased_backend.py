"""TEST DOUBLE: a real backend whose logits get a fixed bias added (e.g. towards tokens that close JSON), so
a random-weight model finishes an unbounded grammar in a few tokens. Everything else is the real backend."""

from __future__ import annotations

import torch


class BiasedBackend:
    def __init__(self, backend, bias: dict[int, float]):
        self.inner, self.bias = backend, bias

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _add(self, logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        for t, b in self.bias.items():
            out[..., t] += b
        return out

    def prefill(self, bucket, inputs):
        return self._add(self.inner.prefill(bucket, inputs))

    def decode(self, inputs):
        return self._add(self.inner.decode(inputs))

    def extend(self, spec, inputs):
        """The extend graph's logits too (a reused or cloned prompt's first token comes from it)."""
        out = self.inner.extend(spec, inputs)
        return self._add(out) if isinstance(out, torch.Tensor) else out
