"""The stateful graph module a Neuron-shaped backend runs: the KV buffers as registered module state.

`NeuronGraphModel` holds the KV buffers ([max_batch, ...]) as registered buffers and updates them out of
place as a function of their old value, so NxD ModelBuilder V2 links them as device-resident state shared
by every prefill bucket and the decode graph (no KV crosses the host between steps). The graph inputs are
explicit positional tensors: int32 ids / positions / indices, masks built with finfo.min, per-layer inputs
(PLE stays on the host); logits come back without the soft-cap, or (the `decode` graph) each row's
K best raw logits and their int32 ids. `compile build --backend neuron` traces this very module, and
`backends/xla.py` runs it on a torch-xla device; it imports no Neuron package.

With an MTP drafter (`attach`; at tp=2 sharded first, `parallel.layers.apply_tp_assistant`) the module also holds
the assistant (`model.assistant.Assistant`, its weights registered once under `drafter.`, beside the target's under
`lm.`) and runs the `draft` phase (`draft_graph.DraftGraph`): it reads the K/V of the target's two store layers from
the registered state and writes none, but re-assigns every KV buffer to itself (`.clone()`, which torch-xla lowers
to the parameter itself: no computation, no copy), so the trace links each as state, read and returned unchanged,
exactly as the other graphs' (a buffer a graph only reads would be taken as a weight). The draft phase is called
with `hidden=` (the forward's last parameter, a keyword: the phases before it keep their positional inputs); a PLE
model's draft takes a one-element placeholder for `per_layer_inputs` (ModelBuilder wants every positional parameter;
the graph reads none). The candidate graphs have `_h` variants (`hidden`: they also return the normed last hidden
state).

The extend graphs over every slot (R = B: the verify graph of speculative decoding) read the KV buffers in place
(`in_place.in_place_forward`: the host rows put in slot order, no gather of the slots' buffers); `in_place = False`
runs them as the other extend graphs (gathering each layer's rows by `slots`: the tests compare the two).

The tied LM head reads the embedding *module* (`TiedHead`), never a Parameter shared by two modules:
torch-xla documents that a Parameter tie made before the move to the device becomes two device copies
(the trace would take the vocab x hidden matrix twice: ~0.8 GB more HBM for E2B).
"""

from __future__ import annotations

import torch
from torch import nn

from neuron_workers.model import window_graphs
from neuron_workers.model.dims import FULL, SLIDING
from neuron_workers.model.graphs import GemmaGraph
from neuron_workers.model.in_place import in_place_forward, in_place_ok
from neuron_workers.model.spec import DECODE, DRAFT, EXTEND, MIXED, PREFILL, decode_candidates, make_spec
from neuron_workers.model.tiled_topk import torch_topk_op

ID_DTYPE = torch.int32  # inf2 downcasts int64 to int32 anyway
# How the draft graph (which writes no KV) keeps every KV buffer as state: "clone" returns an unchanged copy (torch-xla
# lowers it to the parameter itself; whether the runtime then aliases or copies it is what `compile smoke`'s `state`
# step measures), "rmw" writes one entry of each buffer with its own value (a real read-modify-write, as every other
# graph's update: the fallback). A build picks it with GEMMA4_DRAFT_STATE (`neuron_build`).
DRAFT_STATES = ("clone", "rmw")


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
    """Prefill (called with last_idx / ring_idx / slot), extend (last_idx / slots), decode (none of them) and, with a
    drafter, draft (`hidden=`) over KV buffers registered as state, [max_batch, ...] each. ModelBuilder V2 traces
    `forward` once per graph tag; which phase a trace is comes from which inputs it was given, never from a shape (a
    prefill bucket of 1 is not decode). ModelBuilder rejects *args, so the two subclasses below spell the inputs
    out."""

    def __init__(self, hf_lm: nn.Module, dims, max_context: int, max_batch: int, dtype: torch.dtype, kv_heads=None):
        super().__init__()
        tie_head(hf_lm)
        self.dims, self.kv_heads = dims, kv_heads
        self.lm = hf_lm  # the weights, registered once
        # the phase wrappers share self.lm; kept out of the module tree so no weight is listed twice
        self.__dict__["graphs"] = {key: GemmaGraph(hf_lm, dims, spec) for key, spec
                                   in variant_specs(dims, max_context, max_batch, dtype, kv_heads).items()}
        # which variant a trace is: decode and its top-K / `_h` variants have the same inputs, and so have an extend
        # shape's, so the tracer sets these before tracing each (NxDModel tells them apart by their tags at run time)
        self.candidates = 0
        self.per_position = False
        self.hidden = False
        self.mixed = False  # extend inputs that are the mixed graph's (B decode tokens, then one chunk)
        self.in_place = True  # R = B extend graphs read the KV in place (`in_place.py`)
        self.draft_state = "clone"  # how the draft graph keeps the KV as state (`DRAFT_STATES`)
        self.max_batch = max_batch
        self.kv_names = []
        for t in make_spec(dims, DECODE, max_batch, 1, max_context, dtype, ID_DTYPE, kv_heads).kv_inputs:
            name = t.name.replace(".", "_")
            self.register_buffer(name, torch.zeros(t.shape, dtype=dtype))
            self.kv_names.append(name)
        self._topk_op = torch_topk_op
        self.draft_kv: list[str] = []  # k, v of the full store layer, then of the sliding one (`attach`)

    def attach(self, assistant: nn.Module) -> None:
        """Hold `assistant` (on this module's device) as the MTP drafter: its weights registered under `drafter.`,
        the `draft` phase reading the K/V of the target's store layers (`assistant.store_layers`). Its
        `token_ordering` becomes int32, as every index the graphs take (inf2 narrows int64 anyway)."""
        from neuron_workers.model.assistant import store_layers
        from neuron_workers.model.draft_graph import DraftGraph

        head = assistant.masked_embedding
        if head is not None:
            head.token_ordering = head.token_ordering.to(torch.int32)
        self.drafter = assistant
        graph = DraftGraph(assistant, self.lm.model.embed_tokens, ID_DTYPE)
        graph.topk_op = self._topk_op
        self.__dict__["draft_graph"] = graph  # out of the module tree: the target's embedding stays under `lm.`
        at = {layer: 2 * j for j, layer in enumerate(self.dims.kv_layers)}
        sto = store_layers(self.dims)
        self.draft_kv = [self.kv_names[at[sto[t]] + i] for t in (FULL, SLIDING) for i in (0, 1)]

    def use_topk(self, op) -> None:
        """The per-tile top-K op (x, k, dim) the graphs' tiled top-K runs (`tiled_topk.torch_topk_op` unless the
        tracer gives another: the Neuron build passes the SDK's TopK); the drafter's centroids take it too."""
        self._topk_op = op
        for graph in self.graphs.values():
            graph.topk_op = op
        if "draft_graph" in self.__dict__:
            self.draft_graph.topk_op = op

    def step(self, host: list[torch.Tensor], phase: str):
        if phase == DRAFT:
            return self._draft(host)
        graph = self.graphs[self._variant(phase)]
        kv = [getattr(self, n) for n in self.kv_names]
        if self._runs_in_place(graph, host):
            out = in_place_forward(graph, dict(zip(graph.names, host)), kv)
        else:
            out = graph(*host, *kv)
        n = graph.spec.num_heads
        for name, new in zip(self.kv_names, out[n:]):
            setattr(self, name, new)  # out-of-place update that read the old buffer: aliased device state
        return out[0] if n == 1 else tuple(out[:n])

    def _runs_in_place(self, graph, host) -> bool:
        """An extend graph (not mixed) over every slot with T within the rings' slack (static shapes only)."""
        if graph.spec.phase != EXTEND or not self.in_place:
            return False
        rows, t = host[0].shape[:2]
        rings = [getattr(self, n).shape[2] for n, layer in zip(self.kv_names[::2], self.dims.kv_layers)
                 if self.dims.layer_types[layer] == SLIDING]
        ring = rings[0] if rings else t + self.dims.sliding_window
        return in_place_ok(self.dims, self.max_batch, rows, t, ring)

    def _variant(self, phase: str) -> tuple:
        """The graph key (phase, candidates, per_position, hidden) the module's switches name for `phase`."""
        k = 0 if phase == PREFILL else self.candidates
        if phase == EXTEND and self.mixed:
            return MIXED, k, False, bool(self.hidden and k)
        return phase, k, bool(phase == EXTEND and self.per_position and k), bool(self.hidden and k)

    def _draft(self, host: list[torch.Tensor]):
        """One draft step (`draft_graph.DraftGraph`) over the store layers' buffers; every KV buffer is then
        re-assigned to an unchanged copy of itself: linked as state, read, and returned as it was."""
        if "draft_graph" not in self.__dict__:
            raise RuntimeError("this graph model has no drafter: attach one before running the draft phase")
        out = self.draft_graph(*host, *(getattr(self, n) for n in self.draft_kv))
        for name in self.kv_names:
            buf = getattr(self, name)
            if self.draft_state == "rmw":  # the fallback: a real read-modify-write of one entry (its own value)
                first = buf.reshape(-1, buf.shape[-1])[:1]
                setattr(self, name, buf.reshape(-1, buf.shape[-1]).index_copy(
                    0, torch.zeros(1, dtype=torch.int64, device=buf.device), first).reshape(buf.shape))
            else:
                setattr(self, name, buf.clone())
        return out


def variant_specs(dims, max_context: int, max_batch: int, dtype: torch.dtype, kv_heads=None) -> dict:
    """(phase, candidates, per_position, hidden) -> the spec of one graph variant the module runs. Extend: one
    wrapper per head (logits, last candidates, every position's; the candidate ones with and without the hidden
    state); T and R come from the inputs. Decode and mixed: logits, top-K, top-K with the hidden state (the mixed
    graph's inputs are an extend graph's: `mixed` says which)."""
    k = decode_candidates(dims)

    def spec(phase, seq_len, kk=0, every=False, hidden=False):
        return make_spec(dims, phase, max_batch, seq_len, max_context, dtype, ID_DTYPE, kv_heads, kk,
                         1 if phase == EXTEND else 0, every, hidden)

    specs = {(PREFILL, 0, False, False): spec(PREFILL, 2), (DECODE, 0, False, False): spec(DECODE, 1),
             (EXTEND, 0, False, False): spec(EXTEND, 1)}
    specs[(MIXED, 0, False, False)] = spec(MIXED, 1)
    for hidden in (False, True):
        specs[(MIXED, k, False, hidden)] = spec(MIXED, 1, k, hidden=hidden)
        specs[(DECODE, k, False, hidden)] = spec(DECODE, 1, k, hidden=hidden)
        for every in (False, True):
            specs[(EXTEND, k, every, hidden)] = spec(EXTEND, 1, k, every, hidden)
    return specs


def draft_call(inputs, ple: bool) -> tuple[tuple, dict]:
    """The draft step's host inputs (`spec.draft_spec`: ids, hidden, positions, masks) as `forward` takes them:
    (positional args, {"hidden": ...}), with a one-element `per_layer_inputs` placeholder for a PLE model."""
    ids, hidden, positions, mask_full, mask_sliding = inputs
    placeholder = (torch.zeros(1, dtype=hidden.dtype, device=hidden.device),) if ple else ()
    return (ids, positions, *placeholder, mask_full, mask_sliding), {"hidden": hidden}


def media_call(spec, inputs: tuple) -> tuple[tuple, dict]:
    """A graph's inputs as `forward` takes them: a media model's prefill / extend graphs take `mm_embeds`, their
    last input, as a keyword (it follows the optional phase inputs)."""
    if spec.host_inputs and spec.host_inputs[-1].name == "mm_embeds":
        return tuple(inputs[:-1]), {"mm_embeds": inputs[-1]}
    return tuple(inputs), {}


def _phase_inputs(host: list, last_idx, index, slot, mm_embeds=None) -> tuple[list, str]:
    """decode: no last_idx; prefill: last_idx, ring_idx (`index`), slot; extend: last_idx, slots (`index`); then
    `mm_embeds` where the model serves media (a keyword: the prefill and extend graphs' last input)."""
    media = [] if mm_embeds is None else [mm_embeds]
    if last_idx is None:
        return host, DECODE
    if slot is None:
        return host + [last_idx, index] + media, EXTEND
    return host + [last_idx, index, slot] + media, PREFILL


class NeuronGraphPle(NeuronGraphModel):
    def forward(self, input_ids=None, position_ids=None, per_layer_inputs=None, mask_full=None, mask_sliding=None,
                last_idx=None, index=None, slot=None, hidden=None, mm_embeds=None, save_slot=None, save_entry=None,
                save_start=None, restore_slot=None, restore_entry=None, restore_start=None, clone_src=None,
                clone_dst=None):
        window = window_graphs.called(locals())
        if window is not None:  # a kept-window graph (`window_graphs`): its keywords only
            return window_graphs.run(self, window[0], *window[1])
        if hidden is not None:  # draft: per_layer_inputs is a placeholder (`draft_call`)
            return self.step([input_ids, hidden, position_ids, mask_full, mask_sliding], DRAFT)
        host = [input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding]
        return self.step(*_phase_inputs(host, last_idx, index, slot, mm_embeds))


class NeuronGraphNoPle(NeuronGraphModel):
    def forward(self, input_ids=None, position_ids=None, mask_full=None, mask_sliding=None, last_idx=None, index=None,
                slot=None, hidden=None, mm_embeds=None, save_slot=None, save_entry=None, save_start=None,
                restore_slot=None, restore_entry=None, restore_start=None, clone_src=None, clone_dst=None):
        window = window_graphs.called(locals())
        if window is not None:  # a kept-window graph (`window_graphs`): its keywords only
            return window_graphs.run(self, window[0], *window[1])
        if hidden is not None:  # draft
            return self.step([input_ids, hidden, position_ids, mask_full, mask_sliding], DRAFT)
        host = [input_ids, position_ids, mask_full, mask_sliding]
        return self.step(*_phase_inputs(host, last_idx, index, slot, mm_embeds))


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
