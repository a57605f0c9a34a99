"""Neuron backend: compiles the graph modules with NxD ModelBuilder V2 and runs them on NeuronCores.

The only module (with neuron_build.py) that imports torch_neuronx / neuronx_distributed, and only
inside functions. WRITTEN AGAINST THE NxD CORE 0.19 SOURCE AND THE SDK DOCS, NOT RUN ON HARDWARE HERE:
tests/neuron_double.py stands in for the SDK and rejects what the real one would.

Design (one path for tp=1 and tp=2):
- `NeuronGraphModel` holds the KV buffers ([max_batch, ...]) as registered buffers and updates them out
  of place as a function of their old value, so ModelBuilder V2 links them as device-resident state
  shared by every prefill bucket and the decode graph (no KV crosses the host between steps). The graph
  inputs are explicit positional tensors:
  int32 ids/positions/indices, bf16 masks built with finfo.min, bf16 per-layer inputs (PLE stays on
  the host); logits come back without the soft-cap.
- TP: the same `shard_plan` / `tp_modules.apply_tp` as the CPU path, with NxD's collectives at the same
  points (`NxdCollectives`); each rank's weights are sliced from the full checkpoint by the plan.
- Flags: --model-type=transformer --auto-cast=none --enable-saturate-infinity --target inf2, -O1 for
  prefill, -O2 for decode (NxDI's choice: decode is latency bound). Compiling needs a Neuron host.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from neuron_workers.errors import UserError
from neuron_workers.graphs import GemmaGraph
from neuron_workers.spec import DECODE, PREFILL, GraphSpec, make_spec

INSTALL_HINT = ("the neuron backend needs the Neuron SDK 2.31 on an inf2 host: pip install --extra-index-url "
                "https://pip.repos.neuron.amazonaws.com -e '.[neuron]' (torch-neuronx 2.9.0.2.15.32035, "
                "neuronx-cc 2.26.6360.0, neuronx-distributed 0.19.28492)")
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


class NeuronGraphModel(nn.Module):
    """Prefill (called with last_idx / ring_idx / slot) and decode (without them) over KV buffers registered
    as state, [max_batch, ...] each. ModelBuilder V2 traces `forward` once per graph tag; which phase a
    trace is comes from which inputs it was given, never from a shape (a prefill bucket of 1 is not
    decode). ModelBuilder rejects *args, so the two subclasses below spell the inputs out."""

    def __init__(self, hf_lm: nn.Module, dims, max_context: int, max_batch: int, dtype: torch.dtype, kv_heads=None):
        super().__init__()
        pre = make_spec(dims, PREFILL, max_batch, 2, max_context, dtype, ID_DTYPE, kv_heads)
        dec = make_spec(dims, DECODE, max_batch, 1, max_context, dtype, ID_DTYPE, kv_heads)
        self.lm = hf_lm  # the weights, registered once
        # the two phase wrappers share self.lm; kept out of the module tree so no weight is listed twice
        self.__dict__["graphs"] = {PREFILL: GemmaGraph(hf_lm, dims, pre), DECODE: GemmaGraph(hf_lm, dims, dec)}
        self.kv_names = []
        for t in dec.kv_inputs:
            name = t.name.replace(".", "_")
            self.register_buffer(name, torch.zeros(t.shape, dtype=dtype))
            self.kv_names.append(name)

    def step(self, host: list[torch.Tensor], prefill: bool) -> torch.Tensor:
        out = self.graphs[PREFILL if prefill else DECODE](*host, *(getattr(self, n) for n in self.kv_names))
        for name, new in zip(self.kv_names, out[1:]):
            setattr(self, name, new)  # out-of-place update that read the old buffer: aliased device state
        return out[0]


class NeuronGraphPle(NeuronGraphModel):
    def forward(self, input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding, last_idx=None,
                ring_idx=None, slot=None):
        host = [input_ids, position_ids, per_layer_inputs, mask_full, mask_sliding]
        prefill = last_idx is not None
        return self.step(host + [last_idx, ring_idx, slot] if prefill else host, prefill)


class NeuronGraphNoPle(NeuronGraphModel):
    def forward(self, input_ids, position_ids, mask_full, mask_sliding, last_idx=None, ring_idx=None, slot=None):
        host = [input_ids, position_ids, mask_full, mask_sliding]
        prefill = last_idx is not None
        return self.step(host + [last_idx, ring_idx, slot] if prefill else host, prefill)


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
        self.dims, self.max_context, self.max_batch = dims, manifest.max_context, manifest.max_batch
        self.buckets, self.dtype = tuple(manifest.prefill_buckets), _dtype(manifest.dtype)
        self.kv_heads = kv_heads
        self._specs = {}
        from safetensors.torch import load_file

        self.model = nxd.NxDModel.load(str(art_dir / MODEL_FILE))
        if not isinstance(self.model, nxd.NxDModel):  # load() falls back to a bare TorchScript module on error
            raise RuntimeError(f"{art_dir / MODEL_FILE} did not load as an NxDModel (got {type(self.model).__name__}): "
                               f"rebuild the artifacts with the installed neuronx-distributed")
        self.model.set_weights([load_file(str(art_dir / WEIGHTS_DIR / f"tp{r}.safetensors"))
                                for r in range(manifest.tp)])
        self.model.to_neuron()
        self._warm_up()

    def spec(self, phase: str, bucket: int = 1) -> GraphSpec:
        key = (phase, bucket if phase == PREFILL else 1)
        if key not in self._specs:  # built once: decode asks for its spec every token
            self._specs[key] = make_spec(self.dims, phase, self.max_batch, key[1], self.max_context, self.dtype,
                                         ID_DTYPE, self.kv_heads)
        return self._specs[key]

    def _call(self, spec: GraphSpec, inputs) -> torch.Tensor:
        out = self.model.forward(*inputs, model_name=spec.tag)
        return out[0] if isinstance(out, (tuple, list)) else out

    def _warm_up(self) -> None:
        """Run every graph once (the first call of each is slow); KV rows written here are replaced by the
        first prefill into them, and masks hide everything a row has not written."""
        for spec in [self.spec(PREFILL, b) for b in self.buckets] + [self.spec(DECODE)]:
            self._call(spec, tuple(t.zeros() for t in spec.host_inputs))

    def prefill(self, bucket: int, inputs) -> torch.Tensor:
        return self._call(self.spec(PREFILL, bucket), inputs)

    def decode(self, inputs) -> torch.Tensor:
        return self._call(self.spec(DECODE), inputs)

    def close(self) -> None:
        self.model = None


def _dtype(name: str) -> torch.dtype:
    from neuron_workers.loader import DTYPES

    return DTYPES[name]
