"""CPU backend: runs the very graph modules that compile/ traces, in one of three modes, each graph
prepared lazily on first use (one per prefill bucket plus the decode step):

  eager     the nn.Modules as they are (the reference; fastest to start)
  export    strict torch.export programs (what proves the graphs static)
  inductor  torch.compile(fullgraph=True) of the same modules: the fast CPU mode (about a minute of
            compiling per graph on first use), for benchmarks and CPU serving
"""

from __future__ import annotations

import torch

from neuron_workers.backends.base import GraphBackend
from neuron_workers.config import CPU_MODES
from neuron_workers.model import kept_windows
from neuron_workers.model.dims import FULL, SLIDING, ModelDims
from neuron_workers.model.graphs import build_graph
from neuron_workers.model.spec import DECODE, GraphSpec


class CpuBackend(GraphBackend):
    def __init__(self, hf_lm, dims: ModelDims, max_context: int, buckets: tuple[int, ...],
                 dtype: torch.dtype = torch.float32, mode: str = "eager", programs: dict | None = None,
                 kv_heads: tuple[int, ...] | None = None, max_batch: int = 1):
        if mode not in CPU_MODES:
            raise ValueError(f"cpu mode must be one of {CPU_MODES}, got {mode!r}")
        super().__init__(dims, max_context, buckets, max_batch, dtype, kv_heads)
        self.hf_lm, self.mode = hf_lm, mode
        self._graphs: dict[str, object] = dict(programs or {})
        self.kv = [t.zeros() for t in self.spec(DECODE).kv_inputs]
        self.prompt_scores = True  # builds the per-position logits extend graph on first use (prompt logprobs)

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
    def _run(self, spec: GraphSpec, inputs):
        out = self.graph(spec)(*inputs, *self.kv)
        n = spec.num_heads
        self.kv = list(out[n:])
        return out[0] if n == 1 else tuple(out[:n])

    @torch.inference_mode()
    def make_window_pool(self, entries: int) -> None:
        self._windows = kept_windows.sliding_buffers(self.dims)
        self._pool = kept_windows.make_pool(self.kv, self._windows, entries, self.dims.sliding_window)

    @torch.inference_mode()
    def save_window(self, slot: int, entry: int, start: int) -> None:
        kept_windows.save(self.kv, self._pool, self._windows, slot, entry, start)

    @torch.inference_mode()
    def restore_window(self, slot: int, entry: int, start: int) -> None:
        kept_windows.restore(self.kv, self._pool, self._windows, slot, entry, start)

    @torch.inference_mode()
    def clone_slot(self, src: int, dst: int, n: int) -> None:
        kept_windows.clone(self.kv, self._windows, src, dst, n)

    def attach_drafter(self, assistant) -> None:
        from neuron_workers.model.assistant import store_layers
        from neuron_workers.model.draft_graph import DraftGraph

        self.draft_graph = DraftGraph(assistant, self.hf_lm.model.embed_tokens, self.id_dtype).eval()
        at = {layer: 2 * j for j, layer in enumerate(self.dims.kv_layers)}
        self.draft_kv = [at[layer] + i for layer in (store_layers(self.dims)[t] for t in (FULL, SLIDING))
                         for i in (0, 1)]  # k, v of the full store layer, then of the sliding one
        self.hidden_states = True

    @torch.inference_mode()
    def draft(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draft_graph(*inputs, *(self.kv[i] for i in self.draft_kv))

    def close(self) -> None:
        self._graphs.clear()


def export_graph(graph, spec: GraphSpec):
    """Strict torch.export of one graph module with its declared example inputs."""
    with torch.no_grad():
        return torch.export.export(graph, spec.example_inputs(), strict=True)
