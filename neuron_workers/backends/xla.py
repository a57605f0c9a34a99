"""xla backend: the module `compile build --backend neuron` traces (`model.graph_model`), run on a torch-xla
device. A development and test backend (the XLA CPU device; no Neuron import): torch-neuronx 2.9 lowers
the very same module through torch-xla before neuronx-cc sees it, so this is the nearest run to the device
that needs no inf2 host.

- the weights and the KV buffers (registered module state, [max_batch, ...]) live on the device; each call
  moves the host inputs in, runs one graph, syncs once and brings the logits back;
- the tied LM head reads the embedding module (`graph_model.TiedHead`), so the move keeps one copy, and
  the backend checks that it did;
- with an MTP drafter (`attach_drafter`) the assistant moves to the device beside the target and the module runs
  its `draft` phase (reading the store layers' KV state, writing none) and the `_h` candidate graphs;
- per graph tag it counts XLA compilations (`compiles`: one per graph over a whole generation, or a value
  was baked into the graph) and it reports the ops that fell back to the CPU (`fallback_ops`).

torch_xla is imported here only, inside functions: without it the backend is one UserError line.
"""

from __future__ import annotations

import os

import torch

from neuron_workers.backends.base import GraphBackend
from neuron_workers.errors import UserError
from neuron_workers.model import window_graphs
from neuron_workers.model.dims import ModelDims
from neuron_workers.model.graph_model import ID_DTYPE, draft_call, graph_model, media_call
from neuron_workers.model.spec import DRAFT, MIXED, GraphSpec

INSTALL_HINT = ("the xla backend needs torch-xla (CPU device): pip install torch==2.9.0 torch-xla==2.9.0 "
                "(see README, 'The xla backend')")


def require_xla():
    """(torch_xla, its metrics module), or a one-line UserError saying what to install."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")  # a development backend: the XLA CPU client unless told
    try:
        import torch_xla
        import torch_xla.debug.metrics as met
    except ImportError:
        raise UserError(INSTALL_HINT, param="backend") from None
    return torch_xla, met


class XlaBackend(window_graphs.WindowCopies, GraphBackend):
    """`graph_model` on one XLA device, tp=1."""

    id_dtype = ID_DTYPE  # the Neuron graphs' input dtype (int32): the same graphs, the same inputs

    def __init__(self, hf_lm, dims: ModelDims, max_context: int, buckets: tuple[int, ...],
                 dtype: torch.dtype = torch.float32, max_batch: int = 1):
        self._xla, self._met = require_xla()
        super().__init__(dims, max_context, buckets, max_batch, dtype)
        self.device = self._xla.device()
        self.module = graph_model(hf_lm, dims, max_context, max_batch, dtype).to(self.device)
        check_one_embedding(self.module)
        self.compiles: dict[str, int] = {}  # tag -> programs compiled for it (0 if an earlier one was reused)
        self.graph_hashes: dict[str, set] = {}  # tag -> the XLA graph hashes its calls ran (the compile cache key)
        self.calls: dict[str, int] = {}

    @torch.no_grad()
    def _run(self, spec: GraphSpec, inputs):
        before = self._compile_count()
        heads = self._call(spec, inputs)  # KV: module state, replaced on the device
        pending = list(heads) + [getattr(self.module, n) for n in self.module.kv_names]
        self.graph_hashes.setdefault(spec.tag, set()).add(self._xla._XLAC._get_graph_hash(pending))
        self._xla.sync()  # the one graph execution of this call (KV updates included)
        out = tuple(h.cpu() for h in heads)
        self.compiles[spec.tag] = self.compiles.get(spec.tag, 0) + self._compile_count() - before
        self.calls[spec.tag] = self.calls.get(spec.tag, 0) + 1
        return out[0] if len(out) == 1 else out

    def _call(self, spec: GraphSpec, inputs) -> tuple:
        """The graph's heads (logits, the top-K graphs' values and ids [and hidden state], the draft ids and next
        hidden state), still on the device."""
        inputs = tuple(t.to(self.device) for t in inputs)
        if spec.phase == DRAFT:
            args, kwargs = draft_call(inputs, bool(self.dims.ple_dim))
            return self.module(*args, **kwargs)
        self.module.candidates = spec.candidates  # which decode variant (decode and decode_logits share inputs)
        self.module.per_position = spec.per_position  # which extend variant
        self.module.mixed = spec.phase == MIXED  # the mixed graph takes an extend graph's inputs
        self.module.hidden = spec.hidden  # the `_h` variants return the hidden state too
        args, kwargs = media_call(spec, inputs)  # a media model's prefill / extend take mm_embeds by keyword
        out = self.module(*args, **kwargs)
        return out if isinstance(out, tuple) else (out,)

    @torch.no_grad()
    def make_window_pool(self, entries: int) -> None:
        window_graphs.make_pool(self.module, entries)
        self._xla.sync()

    @torch.no_grad()
    def _window(self, phase: str, *ints: int) -> None:
        """One window graph (`model/window_graphs.py`) over the module's state, its indices int32 [1] inputs."""
        before = self._compile_count()
        self.module(**window_graphs.inputs(phase, *ints, device=self.device))  # as the traced graph is called
        self._xla.sync()
        self.compiles[phase] = self.compiles.get(phase, 0) + self._compile_count() - before
        self.calls[phase] = self.calls.get(phase, 0) + 1

    def attach_drafter(self, assistant) -> None:
        self.module.attach(assistant.to(self.device))
        self._xla.sync()  # the move (and token_ordering's int32 cast) now, not inside the first graph's count
        self.hidden_states = True

    def draft(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run(self.spec(DRAFT), inputs)

    def _compile_count(self) -> int:
        return int(self._met.counter_value("UncachedCompile") or 0)

    def fallback_ops(self) -> dict[str, int]:
        """aten ops that ran on the CPU instead of the XLA device (torch-xla's `aten::` counters)."""
        return {c: int(self._met.counter_value(c)) for c in self._met.counter_names() if c.startswith("aten::")}

    def hlo(self, spec: GraphSpec, inputs) -> str:
        """The HLO text of one graph for these host inputs, without running it (KV state left as it was)."""
        saved = {n: getattr(self.module, n) for n in self.module.kv_names}
        try:
            with torch.no_grad():
                outs = list(self._call(spec, inputs)) + [getattr(self.module, n) for n in self.module.kv_names]
                return self._xla._XLAC._get_xla_tensors_hlo(outs)
        finally:
            for n, t in saved.items():
                setattr(self.module, n, t)

    def close(self) -> None:
        self.module = None


def check_one_embedding(module) -> None:
    """The LM head must use the embedding's own device tensor: a Parameter tie made before a move to an XLA
    device becomes two copies (torch-xla's documented behaviour), i.e. a second vocab x hidden matrix."""
    if module.lm.lm_head.weight is not module.lm.model.embed_tokens.weight:
        raise RuntimeError("the LM head holds its own copy of the embedding on the XLA device")
