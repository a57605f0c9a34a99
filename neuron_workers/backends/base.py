"""The backend skeleton every backend shares: the spec cache and the prefill / decode dispatch.

A backend owns the KV buffers ([max_batch, ...] per KV layer) between calls. Call order: `prefill(bucket, inputs)`
writes one prompt into the slot its inputs name, then `decode(inputs)` advances every slot by one token, repeatedly;
prefills may come between decodes. `extend(spec, inputs)` runs R rows x T new tokens over what their slots hold
(chunked prefill, and the verify step of speculative decoding); `mixed_spec` graphs run through it too (a chunk
and every slot's decode token in one step). `inputs` are the spec's host inputs
(`GraphSpec.host_inputs`), in order. `decode_candidates(inputs)` is the same step through the top-K variant of the
decode graph (`candidates` K; 0: the backend has none), which returns each row's K best logits and ids instead of the
whole vocabulary. Subclasses implement `_run(spec, inputs)`: it returns the outputs before the KV buffers (the
logits, or candidate values and ids); those that keep sliding windows for prefix reuse (`prefix_windows`) also
`make_window_pool`, `save_window`, `restore_window` and `clone_slot`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from neuron_workers.model.dims import ModelDims
from neuron_workers.model.spec import (
    DECODE,
    EXTEND,
    MIXED,
    PREFILL,
    Candidates,
    GraphSpec,
    decode_candidates,
    make_spec,
)


class Backend(Protocol):
    """What the engine needs of a backend."""

    max_context: int
    max_batch: int
    buckets: tuple[int, ...]
    extend_buckets: tuple[int, ...]  # T of the extend graphs built (chunked prefill's chunk among them)
    candidates: int  # K of decode_candidates (0: none; the engine then always decodes logits)

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec: ...

    def prefill(self, bucket: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run the prefill graph of `bucket`; returns logits [1, vocab] (raw, no soft-cap)."""
        ...

    def decode(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Run one decode step for all slots; returns logits [max_batch, vocab] (raw, no soft-cap)."""
        ...

    def decode_candidates(self, inputs: tuple[torch.Tensor, ...]) -> Candidates:
        """The same step; returns each slot's `candidates` best raw logits and their ids, best first."""
        ...

    def close(self) -> None: ...


class GraphBackend:
    """Shared plumbing: one `GraphSpec` per graph, built once (decode asks for its spec every token), and
    prefill / decode routed to `_run` with that spec."""

    id_dtype: torch.dtype = torch.int64

    def __init__(self, dims: ModelDims, max_context: int, buckets, max_batch: int, dtype: torch.dtype,
                 kv_heads: tuple[int, ...] | None = None):
        self.dims, self.dtype, self.kv_heads = dims, dtype, kv_heads  # kv_heads: a TP rank's (None: unsharded)
        self.max_context, self.buckets, self.max_batch = max_context, tuple(sorted(buckets)), max_batch
        self._specs: dict[tuple[str, int, int], GraphSpec] = {}
        self.candidates = decode_candidates(dims)
        self.extend_buckets: tuple[int, ...] = ()
        self.hidden_states = False  # candidate graphs also return the hidden state (`attach_drafter`)
        self.mixed_steps = True  # the mixed graphs (`mixed_spec`) can run (built on first use here)

    def spec(self, phase: str, bucket: int = 1, candidates: int = 0, rows: int = 0,
             per_position: bool = False, hidden: bool = False) -> GraphSpec:
        key = (phase, bucket if phase in (PREFILL, EXTEND, MIXED) else 1, candidates, rows, per_position, hidden)
        if key not in self._specs:
            self._specs[key] = make_spec(self.dims, phase, self.max_batch, key[1], self.max_context, self.dtype,
                                         self.id_dtype, self.kv_heads, candidates, rows, per_position, hidden)
        return self._specs[key]

    def extend_spec(self, t: int, rows: int = 1, logits: bool = False, per_position: bool = False) -> GraphSpec:
        """The extend graph of `rows` x `t` new tokens: top-K candidates of the last position (of every
        position with `per_position`), or the last position's full logits (`logits`; every position's with
        `per_position`: prompt logprobs)."""
        k = 0 if logits or not self.candidates else self.candidates
        return self.spec(EXTEND, t, k, rows, per_position, self.hidden_states and bool(k))

    def mixed_spec(self, t: int, logits: bool = False) -> GraphSpec:
        """The mixed graph: the decode tokens of all slots and `t` chunk tokens of one row in one step; top-K
        candidates of its B + 1 rows (and their hidden states beside an MTP drafter), or their full logits
        (`logits`)."""
        k = 0 if logits or not self.candidates else self.candidates
        return self.spec(MIXED, t, k, hidden=self.hidden_states and bool(k))

    def extend(self, spec: GraphSpec, inputs):
        """Run an extend graph (`extend_spec`): its candidates (a `Candidates`) or logits [rows, vocab]."""
        out = self._run(spec, inputs)
        return Candidates(*out) if spec.candidates else out

    def prefill(self, bucket: int, inputs) -> torch.Tensor:
        return self._run(self.spec(PREFILL, bucket), inputs)

    def decode(self, inputs) -> torch.Tensor:
        return self._run(self.spec(DECODE), inputs)

    def decode_candidates(self, inputs) -> Candidates:
        if not self.candidates:
            raise RuntimeError("this backend has no top-K decode graph: use decode")
        return Candidates(*self._run(self.spec(DECODE, 1, self.candidates, hidden=self.hidden_states), inputs))

    def attach_drafter(self, assistant) -> None:
        """Run `assistant` (`model.assistant.Assistant`) as the MTP drafter: `draft` steps over the KV buffers,
        and the candidate graphs return the hidden state it reads."""
        raise NotImplementedError(f"{type(self).__name__} has no MTP drafter")

    def draft(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step for every slot (`draft_graph.DraftGraph`'s host inputs): (draft ids [B, 1], the
        drafter's next hidden state [B, 1, H])."""
        raise NotImplementedError(f"{type(self).__name__} has no MTP drafter")

    def make_window_pool(self, entries: int) -> None:
        """Room for `entries` kept sliding windows beside the KV (`model/kept_windows.py`)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no sliding windows (prefix_windows: 0)")

    def save_window(self, slot: int, entry: int, start: int) -> None:
        """Pool entry `entry` <- slot `slot`'s sliding windows of positions start .. start + W - 1."""
        raise NotImplementedError(f"{type(self).__name__} keeps no sliding windows")

    def restore_window(self, slot: int, entry: int, start: int) -> None:
        """Slot `slot`'s rings at positions start .. start + W - 1 <- pool entry `entry`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no sliding windows")

    def clone_slot(self, src: int, dst: int, n: int) -> None:
        """Slot `dst` <- slot `src`'s first `n` positions (full layers) and its rings."""
        raise NotImplementedError(f"{type(self).__name__} keeps no sliding windows")

    def _run(self, spec: GraphSpec, inputs):
        raise NotImplementedError

    def close(self) -> None:
        pass
