"""CPU backend: runs the very graph modules that compile/ traces, eagerly or as strict torch.export
programs (exported lazily, one per prefill bucket plus the decode step, on first use)."""

from __future__ import annotations

import torch

from neuron_workers.dims import ModelDims
from neuron_workers.graphs import build_graph
from neuron_workers.spec import DECODE, PREFILL, GraphSpec, make_spec


class CpuBackend:
    def __init__(self, hf_lm, dims: ModelDims, max_context: int, buckets: tuple[int, ...],
                 dtype: torch.dtype = torch.float32, exported: bool = False, programs: dict | None = None):
        self.hf_lm, self.dims, self.dtype, self.exported = hf_lm, dims, dtype, exported
        self.max_context, self.buckets = max_context, tuple(sorted(buckets))
        self._graphs: dict[str, object] = dict(programs or {})
        self.kv = [t.zeros() for t in self.spec(DECODE).kv_inputs]

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec:
        return make_spec(self.dims, phase, 1, bucket, self.max_context, self.dtype)

    def graph(self, spec: GraphSpec):
        fn = self._graphs.get(spec.tag)
        if fn is None:
            fn = build_graph(self.hf_lm, self.dims, spec)
            if self.exported:
                fn = export_graph(fn, spec).module()
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
