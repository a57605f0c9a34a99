"""LogitsRecorder: a backend wrapper that keeps (phase, logits) of every call, to compare two backends step by step
(the inf2 smoke test against the CPU backend, and the tests). With `keep_inputs` it also keeps (bucket, host inputs)
of every call (an extend call: its spec in place of the bucket), so another backend can be fed the very same inputs
(teacher forcing: one near-tie cannot send the two down different token paths)."""

from __future__ import annotations


class LogitsRecorder:
    candidates = 0  # the engine decodes full logits through it (nothing to compare in top-K candidates)

    def __init__(self, backend, keep_inputs: bool = False):
        self.inner, self.calls, self.keep_inputs, self.inputs = backend, [], keep_inputs, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, bucket, inputs):
        self._keep(bucket, inputs)
        out = self.inner.prefill(bucket, inputs)
        self.calls.append(("prefill", out.clone()))
        return out

    def decode(self, inputs):
        self._keep(1, inputs)
        out = self.inner.decode(inputs)
        self.calls.append(("decode", out.clone()))
        return out

    def extend(self, spec, inputs):
        self._keep(spec, inputs)
        out = self.inner.extend(spec, inputs)
        self.calls.append(("extend", out.clone()))
        return out

    def _keep(self, bucket, inputs):
        if self.keep_inputs:  # the decode inputs are updated in place between steps: copy them
            self.inputs.append((bucket, tuple(t.clone() for t in inputs)))


def replay(backend, recorder: LogitsRecorder) -> list:
    """The logits `backend` gives for the recorded calls, in order, each input cast to the backend's spec."""
    from neuron_workers.model.spec import DECODE, PREFILL

    out = []
    for (phase, _), (bucket, inputs) in zip(recorder.calls, recorder.inputs):
        if phase == "extend":  # `bucket` is the extend graph's spec
            spec = backend.spec(bucket.phase, bucket.seq_len, bucket.candidates, bucket.rows, bucket.per_position)
            out.append(backend.extend(spec, tuple(t.to(s.dtype) for t, s in zip(inputs, spec.host_inputs))))
            continue
        spec = backend.spec(phase if phase == PREFILL else DECODE, bucket)
        cast = tuple(t.to(s.dtype) for t, s in zip(inputs, spec.host_inputs))
        out.append(backend.prefill(bucket, cast) if phase == PREFILL else backend.decode(cast))
    return out
