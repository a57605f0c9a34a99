"""CPU backend: runs the very graph modules that compile/ traces, in one of three modes, each graph
prepared lazily on first use (one per prefill bucket plus the decode step):

  eager     the nn.Modules as they are (the reference; fastest to start)
  export    strict torch.export programs (what proves the graphs static)
  inductor  torch.compile(fullgraph=True) of the same modules: the fast CPU mode (about a minute of
            compiling per graph on first use), for benchmarks and CPU serving
"""

from __future__ import annotations

import torch

from neuron_workers.dims import ModelDims
from neuron_workers.graphs import build_graph
from neuron_workers.spec import DECODE, PREFILL, GraphSpec, make_spec

CPU_MODES = ("eager", "export", "inductor")


class CpuBackend:
    def __init__(self, hf_lm, dims: ModelDims, max_context: int, buckets: tuple[int, ...],
                 dtype: torch.dtype = torch.float32, mode: str = "eager", programs: dict | None = None,
                 kv_heads: tuple[int, ...] | None = None, max_batch: int = 1):
        if mode not in CPU_MODES:
            raise ValueError(f"cpu mode must be one of {CPU_MODES}, got {mode!r}")
        self.hf_lm, self.dims, self.dtype, self.mode = hf_lm, dims, dtype, mode
        self.max_context, self.buckets, self.max_batch = max_context, tuple(sorted(buckets)), max_batch
        self.kv_heads = kv_heads  # a TP rank's KV heads per layer (None: unsharded)
        self._graphs: dict[str, object] = dict(programs or {})
        self._specs: dict[tuple, GraphSpec] = {}
        self.kv = [t.zeros() for t in self.spec(DECODE).kv_inputs]

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec:
        key = (phase, bucket if phase == PREFILL else 1)
        if key not in self._specs:  # built once: decode asks for its spec every token
            self._specs[key] = make_spec(self.dims, phase, self.max_batch, key[1], self.max_context, self.dtype,
                                         kv_heads=self.kv_heads)
        return self._specs[key]

    def graph(self, spec: GraphSpec):
        fn = self._graphs.get(spec.tag)
        if fn is None:
            fn = build_graph(self.hf_lm, self.dims, spec)
            if self.mode == "export":
                fn = export_graph(fn, spec).module()
            elif self.mode == "inductor":
                fn = torch.compile(fn, dynamic=False, fullgraph=True)
            self._graphs[spec.tag] = fn
        return fn

    @torch.inference_mode()
    def _run(self, spec: GraphSpec, inputs) -> torch.Tensor:
        out = self.graph(spec)(*inputs, *self.kv)
        self.kv = list(out[1:])
        return out[0]

    def prefill(self, bucket: int, inputs) -> torch.Tensor:
        return self._run(self.spec(PREFILL, bucket), inputs)

    def decode(self, inputs) -> torch.Tensor:
        return self._run(self.spec(DECODE), inputs)

    def close(self) -> None:
        self._graphs.clear()


def export_graph(graph, spec: GraphSpec):
    """Strict torch.export of one graph module with its declared example inputs."""
    with torch.no_grad():
        return torch.export.export(graph, spec.example_inputs(), strict=True)
