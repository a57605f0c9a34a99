"""Neuron backend: compiles the graph modules with NxD ModelBuilder V2 and runs them on NeuronCores.

The only module that imports torch_neuronx / neuronx_distributed, and only inside functions.
WRITTEN AGAINST THE DOCUMENTED APIs (shared/reference/neuron-api.md), NOT RUN ON HARDWARE HERE:
its calls are checked by a recording test double (tests/neuron_double.py).

Design (one path for tp=1 and tp=2):
- `NeuronGraphModel` holds the KV buffers as registered buffers and updates them out of place, so
  ModelBuilder V2 turns them into device-resident state shared by every prefill bucket and the decode
  graph (no KV crosses the host between steps). The graph inputs are explicit positional tensors:
  int32 ids/positions/indices, bf16 masks built with finfo.min, bf16 per-layer inputs (PLE stays on
  the host); logits come back without the soft-cap.
- TP: the same `shard_plan` / `tp_modules.apply_tp` as the CPU path, with NxD's collectives at the same
  points (`NxdCollectives`); each rank's weights are sliced from the full checkpoint by the plan.
- Flags: --model-type=transformer --auto-cast=none --enable-saturate-infinity --target inf2, -O1 for
  prefill, -O2 for decode (NxDI's choice: decode is latency bound). --target lets a build host cross-compile.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from neuron_workers.errors import UserError
from neuron_workers.graphs import GemmaGraph
from neuron_workers.spec import DECODE, PREFILL, GraphSpec, TensorSpec, make_spec

INSTALL_HINT = ("the neuron backend needs the Neuron SDK (torch-neuronx 2.9, neuronx-cc, neuronx-distributed): "
                "pip install --extra-index-url https://pip.repos.neuron.amazonaws.com "
                "torch-neuronx==2.9.* neuronx-cc==2.* neuronx-distributed")
BASE_FLAGS = "--model-type=transformer --auto-cast=none --enable-saturate-infinity --target inf2"
PHASE_FLAGS = {PREFILL: f"{BASE_FLAGS} -O1", DECODE: f"{BASE_FLAGS} -O2"}
ID_DTYPE = torch.int32  # inf2 downcasts int64 to int32 anyway
MODEL_FILE, WEIGHTS_DIR = "nxd_model.pt", "weights"


def require_neuron():
    """(torch_neuronx, neuronx_distributed), or a one-line UserError saying what to install."""
    try:
        import neuronx_distributed
        import torch_neuronx
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return torch_neuronx, neuronx_distributed


class NxdCollectives:
    """tp_modules.Collectives over NxD's tensor-parallel group (XLA collectives in the traced graph)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        from neuronx_distributed.parallel_layers.mappings import reduce_from_tensor_model_parallel_region

        return reduce_from_tensor_model_parallel_region(x)

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        from neuronx_distributed.parallel_layers.mappings import gather_from_tensor_model_parallel_region

        if dim not in (-1, x.dim() - 1):
            raise ValueError("NxD gathers along the last dimension only")
        return gather_from_tensor_model_parallel_region(x)


def graph_inputs(spec: GraphSpec) -> tuple[TensorSpec, ...]:
    """Positional inputs of the Neuron graphs: the spec's non-KV inputs; decode also takes the (unused)
    last_idx / ring_idx so prefill and decode share one forward signature."""
    fixed = spec.inputs[: len(spec.inputs) - spec.num_kv]
    if spec.phase == DECODE:
        ring = next(t.shape[-1] for t in spec.inputs if t.name == "mask_sliding")
        fixed += (TensorSpec("last_idx", (spec.batch,), ID_DTYPE), TensorSpec("ring_idx", (spec.batch, ring), ID_DTYPE))
    return fixed


class NeuronGraphModel(nn.Module):
    """Prefill (seq > 1) and decode (seq == 1) over KV buffers registered as state."""

    def __init__(self, hf_lm: nn.Module, dims, max_context: int, dtype: torch.dtype, kv_heads=None):
        super().__init__()
        pre = make_spec(dims, PREFILL, 1, 2, max_context, dtype, ID_DTYPE, kv_heads)
        dec = make_spec(dims, DECODE, 1, 1, max_context, dtype, ID_DTYPE, kv_heads)
        self.lm = hf_lm  # the weights, registered once
        # the two phase wrappers share self.lm; kept out of the module tree so no weight is listed twice
        self.__dict__["graphs"] = {PREFILL: GemmaGraph(hf_lm, dims, pre), DECODE: GemmaGraph(hf_lm, dims, dec)}
        self.kv_names = []
        for t in dec.kv_inputs:
            name = t.name.replace(".", "_")
            self.register_buffer(name, torch.zeros(t.shape, dtype=dtype))
            self.kv_names.append(name)

    def step(self, input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding, last_idx, ring_idx):
        phase = DECODE if input_ids.shape[1] == 1 else PREFILL  # static per traced shape
        graph = self.graphs[phase]
        x = [input_ids, position_ids] + ([per_layer_inputs] if per_layer_inputs is not None else [])
        x += [mask_full, mask_sliding] + ([last_idx, ring_idx] if phase == PREFILL else [])
        out = graph(*x, *(getattr(self, n) for n in self.kv_names))
        for name, new in zip(self.kv_names, out[1:]):
            setattr(self, name, new)  # out-of-place update: ModelBuilder aliases it to device state
        return out[0]


class NeuronGraphPle(NeuronGraphModel):
    def forward(self, input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding, last_idx, ring_idx):
        return self.step(input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding, last_idx, ring_idx)


class NeuronGraphNoPle(NeuronGraphModel):
    def forward(self, input_ids, position_ids, mask_full, mask_sliding, last_idx, ring_idx):
        return self.step(input_ids, position_ids, None, mask_full, mask_sliding, last_idx, ring_idx)


def graph_model(hf_lm, dims, max_context, dtype, kv_heads=None) -> NeuronGraphModel:
    cls = NeuronGraphPle if dims.ple_dim else NeuronGraphNoPle
    return cls(hf_lm, dims, max_context, dtype, kv_heads).eval()


def rank_state_dict(model: NeuronGraphModel, full: dict[str, torch.Tensor], plan, rank: int) -> dict:
    """Rank `rank`'s weights for `model` (built for any rank), sliced from the full HF state dict."""
    from neuron_workers.tp_modules import shard_tensor

    out = {}
    for key in model.state_dict():
        if key in model.kv_names:
            continue  # KV state starts at zero on the device
        hf_key = key.removeprefix("lm.").replace("lm_head.embedding.", "model.embed_tokens.")
        hf_key = "model.embed_tokens.weight" if hf_key == "lm_head.weight" else hf_key  # tied
        if hf_key.endswith("vocab_start"):
            out[key] = torch.tensor([rank * plan.vocab_per_rank], dtype=torch.int32)
        else:
            out[key] = shard_tensor(plan, hf_key, full[hf_key], rank)
    return out


class NeuronBackend:
    """Runs compiled artifacts: one NxDModel holding every graph, KV state on the device."""

    def __init__(self, art_dir: str | Path, dims, manifest, kv_heads=None):
        torch_neuronx, nxd = require_neuron()
        art_dir = Path(art_dir)
        self.dims, self.max_context = dims, manifest.max_context
        self.buckets, self.dtype = tuple(manifest.prefill_buckets), _dtype(manifest.dtype)
        self.kv_heads = kv_heads
        self._specs, self._extra = {}, {}
        from safetensors.torch import load_file

        self.model = nxd.NxDModel.load(str(art_dir / MODEL_FILE))
        self.model.set_weights([load_file(str(art_dir / WEIGHTS_DIR / f"tp{r}.safetensors"))
                                for r in range(manifest.tp)])
        self.model.to_neuron()
        self._warm_up()

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec:
        key = (phase, bucket if phase == PREFILL else 1)
        if key not in self._specs:  # built once: decode asks for its spec every token
            self._specs[key] = make_spec(self.dims, phase, 1, key[1], self.max_context, self.dtype, ID_DTYPE,
                                         self.kv_heads)
            self._extra[key] = tuple(t.zeros() for t in graph_inputs(self._specs[key])[
                len(self._specs[key].inputs) - self._specs[key].num_kv:])  # decode's unused prefill inputs
        return self._specs[key]

    def _call(self, spec: GraphSpec, inputs) -> torch.Tensor:
        extra = self._extra[(spec.phase, spec.seq_len)]
        out = self.model.forward(*inputs, *extra, model_name=spec.tag)
        return out[0] if isinstance(out, (tuple, list)) else out

    def _warm_up(self) -> None:
        for spec in [self.spec(PREFILL, b) for b in self.buckets] + [self.spec(DECODE)]:
            fixed = spec.inputs[: len(spec.inputs) - spec.num_kv]
            self._call(spec, tuple(t.zeros() for t in fixed))

    def prefill(self, bucket: int, inputs) -> torch.Tensor:
        return self._call(self.spec(PREFILL, bucket), inputs)

    def decode(self, inputs) -> torch.Tensor:
        return self._call(self.spec(DECODE), inputs)

    def close(self) -> None:
        self.model = None


def _dtype(name: str) -> torch.dtype:
    from neuron_workers.loader import DTYPES

    return DTYPES[name]
