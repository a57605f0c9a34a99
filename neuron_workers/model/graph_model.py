"""The stateful graph module a Neuron-shaped backend runs: the KV buffers as registered module state.

`NeuronGraphModel` holds the KV buffers ([max_batch, ...]) as registered buffers and updates them out of
place as a function of their old value, so NxD ModelBuilder V2 links them as device-resident state shared
by every prefill bucket and the decode graph (no KV crosses the host between steps). The graph inputs are
explicit positional tensors: int32 ids / positions / indices, masks built with finfo.min, per-layer inputs
(PLE stays on the host); logits come back without the soft-cap, or (the `decode` graph) each row's
K best raw logits and their int32 ids. `compile build --backend neuron` traces this very module, and
`backends/xla.py` runs it on a torch-xla device; it imports no Neuron package.

The tied LM head reads the embedding *module* (`TiedHead`), never a Parameter shared by two modules:
torch-xla documents that a Parameter tie made before the move to the device becomes two device copies
(the trace would take the vocab x hidden matrix twice: ~0.8 GB more HBM for E2B).
"""

from __future__ import annotations

import torch
from torch import nn

from neuron_workers.model.graphs import GemmaGraph
from neuron_workers.model.spec import DECODE, EXTEND, PREFILL, decode_candidates, make_spec

ID_DTYPE = torch.int32  # inf2 downcasts int64 to int32 anyway


class TiedHead(nn.Module):
    """The LM head as a view of the embedding module's weight (at tp>1 `parallel.layers.VocabParallelHead`
    does the same with the rank's shard)."""

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.embedding = embedding

    @property
    def weight(self) -> torch.Tensor:  # as nn.Linear's, for code that reads the head's weight
        return self.embedding.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(h, self.embedding.weight)


def tie_head(hf_lm: nn.Module) -> nn.Module:
    """Replace an `nn.Linear` head tied by Parameter to the embedding with a `TiedHead` (same math)."""
    head, emb = hf_lm.lm_head, hf_lm.model.embed_tokens
    if isinstance(head, nn.Linear) and head.weight is emb.weight and head.bias is None:
        hf_lm.lm_head = TiedHead(emb)
    return hf_lm


class NeuronGraphModel(nn.Module):
    """Prefill (called with last_idx / ring_idx / slot), extend (last_idx / slots) and decode (none of them) over KV
    buffers registered as state, [max_batch, ...] each. ModelBuilder V2 traces `forward` once per graph tag; which
    phase a trace is comes from which inputs it was given, never from a shape (a prefill bucket of 1 is not decode).
    ModelBuilder rejects *args, so the two subclasses below spell the inputs out."""

    def __init__(self, hf_lm: nn.Module, dims, max_context: int, max_batch: int, dtype: torch.dtype, kv_heads=None):
        super().__init__()
        tie_head(hf_lm)
        k = decode_candidates(dims)
        specs = {PREFILL: make_spec(dims, PREFILL, max_batch, 2, max_context, dtype, ID_DTYPE, kv_heads),
                 DECODE: make_spec(dims, DECODE, max_batch, 1, max_context, dtype, ID_DTYPE, kv_heads),
                 (DECODE, k): make_spec(dims, DECODE, max_batch, 1, max_context, dtype, ID_DTYPE, kv_heads, k)}
        # extend: one wrapper per head (logits, last candidates, every position's); T and R come from the inputs
        for kk, every in ((0, False), (k, False), (k, True)):
            specs[(EXTEND, kk, every)] = make_spec(dims, EXTEND, max_batch, 1, max_context, dtype, ID_DTYPE, kv_heads,
                                                   kk, 1, every)
        self.lm = hf_lm  # the weights, registered once
        # the phase wrappers share self.lm; kept out of the module tree so no weight is listed twice
        self.__dict__["graphs"] = {key: GemmaGraph(hf_lm, dims, spec) for key, spec in specs.items()}
        # which decode variant a trace is: the top-K one has the same inputs as `decode`, so the tracer sets
        # this before tracing it (NxDModel tells the two apart by their tags at run time)
        self.candidates = 0
        self.per_position = False  # which extend variant a trace is (set like `candidates`)
        self.kv_names = []
        for t in specs[DECODE].kv_inputs:
            name = t.name.replace(".", "_")
            self.register_buffer(name, torch.zeros(t.shape, dtype=dtype))
            self.kv_names.append(name)

    def use_topk(self, op) -> None:
        """The per-tile top-K op (x, k, dim) the `decode` graph's tiled top-K runs (`tiled_topk.torch_topk_op`
        unless the tracer gives another: the Neuron build passes the SDK's TopK)."""
        for graph in self.graphs.values():
            graph.topk_op = op

    def step(self, host: list[torch.Tensor], phase: str):
        if phase == EXTEND:
            graph = self.graphs[(EXTEND, self.candidates, self.per_position and bool(self.candidates))]
        else:
            graph = self.graphs[phase if phase == PREFILL or not self.candidates else (DECODE, self.candidates)]
        out = graph(*host, *(getattr(self, n) for n in self.kv_names))
        n = graph.spec.num_heads
        for name, new in zip(self.kv_names, out[n:]):
            setattr(self, name, new)  # out-of-place update that read the old buffer: aliased device state
        return out[0] if n == 1 else tuple(out[:n])


def _phase_inputs(host: list, last_idx, index, slot) -> tuple[list, str]:
    """decode: no last_idx; prefill: last_idx, ring_idx (`index`), slot; extend: last_idx, slots (`index`)."""
    if last_idx is None:
        return host, DECODE
    if slot is None:
        return host + [last_idx, index], EXTEND
    return host + [last_idx, index, slot], PREFILL


class NeuronGraphPle(NeuronGraphModel):
    def forward(self, input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding, last_idx=None,
                index=None, slot=None):
        host = [input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding]
        return self.step(*_phase_inputs(host, last_idx, index, slot))


class NeuronGraphNoPle(NeuronGraphModel):
    def forward(self, input_ids, position_ids, mask_full, mask_sliding, last_idx=None, index=None, slot=None):
        host = [input_ids, position_ids, mask_full, mask_sliding]
        return self.step(*_phase_inputs(host, last_idx, index, slot))


def graph_model(hf_lm, dims, max_context, max_batch, dtype, kv_heads=None) -> NeuronGraphModel:
    cls = NeuronGraphPle if dims.ple_dim else NeuronGraphNoPle
    return cls(hf_lm, dims, max_context, max_batch, dtype, kv_heads).eval()


def make_buffers_persistent(module: nn.Module) -> list[str]:
    """Turn the non-persistent buffers the forward reads (HF RoPE `inv_freq` tables, `embed_scale`) into
    persistent ones, so they are in the state dict we save: the trace takes every tensor the forward
    reads as a weight input, and NxDModel.set_weights does not check names. Returns their names."""
    names = []
    for prefix, m in module.named_modules():
        for b in sorted(m._non_persistent_buffers_set):
            names.append(f"{prefix}.{b}" if prefix else b)
        m._non_persistent_buffers_set.clear()
    return names
