"""LogitsRecorder: a backend wrapper that keeps (phase, logits) of every call, to compare two backends
step by step (the inf2 smoke test against the CPU backend, and the tests)."""

from __future__ import annotations


class LogitsRecorder:
    candidates = 0  # the engine decodes full logits through it (nothing to compare in top-K candidates)

    def __init__(self, backend):
        self.inner, self.calls = backend, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, bucket, inputs):
        out = self.inner.prefill(bucket, inputs)
        self.calls.append(("prefill", out.clone()))
        return out

    def decode(self, inputs):
        out = self.inner.decode(inputs)
        self.calls.append(("decode", out.clone()))
        return out
