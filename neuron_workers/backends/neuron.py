"""Neuron backend: runs graphs compiled by neuronx-cc (through NxD ModelBuilder V2) on NeuronCores.

The only modules (with neuron_build.py) that import torch_neuronx / neuronx_distributed, and only
inside functions. WRITTEN AGAINST THE NxD CORE 0.19 SOURCE AND THE SDK DOCS, NOT RUN ON HARDWARE HERE:
tests/doubles/neuron_double.py stands in for the SDK and rejects what the real one would.

Design (one path for tp=1 and tp=2):
- the traced module is `model.graph_model.NeuronGraphModel`: KV buffers as registered state, updated
  from their old value, shared by every prefill bucket and the decode graph (no KV crosses the host);
- TP: the same `parallel.shard_plan` / `parallel.layers.apply_tp` as the CPU path, with NxD's
  collectives at the same points (`parallel.collectives.NxdCollectives`);
- flags: --model-type=transformer --auto-cast=none --enable-saturate-infinity --target inf2, -O1 for
  prefill, -O2 for decode (NxDI's choice: decode is latency bound). Compiling needs a Neuron host.
"""

from __future__ import annotations

from pathlib import Path

from neuron_workers.backends.base import GraphBackend
from neuron_workers.errors import UserError
from neuron_workers.model.graph_model import ID_DTYPE
from neuron_workers.model.spec import DECODE, PREFILL, GraphSpec

INSTALL_HINT = ("the neuron backend needs the Neuron SDK 2.31 on an inf2 host: pip install --extra-index-url "
                "https://pip.repos.neuron.amazonaws.com -e '.[neuron]' (torch-neuronx 2.9.0.2.15.32035, "
                "neuronx-cc 2.26.6360.0, neuronx-distributed 0.19.28492)")
BASE_FLAGS = "--model-type=transformer --auto-cast=none --enable-saturate-infinity --target inf2"
PHASE_FLAGS = {PREFILL: f"{BASE_FLAGS} -O1", DECODE: f"{BASE_FLAGS} -O2"}
MODEL_FILE, WEIGHTS_DIR = "nxd_model.pt", "weights"


def require_neuron():
    """(torch_neuronx, neuronx_distributed), or a one-line UserError saying what to install."""
    try:
        import neuronx_distributed
        import torch_neuronx
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return torch_neuronx, neuronx_distributed


class NeuronBackend(GraphBackend):
    """Runs compiled artifacts: one NxDModel holding every graph, KV state on the device."""

    id_dtype = ID_DTYPE

    def __init__(self, art_dir: str | Path, dims, manifest, kv_heads=None):
        from neuron_workers.model.loader import DTYPES

        torch_neuronx, nxd = require_neuron()
        super().__init__(dims, manifest.max_context, manifest.prefill_buckets, manifest.max_batch,
                         DTYPES[manifest.dtype], kv_heads)
        art_dir = Path(art_dir)
        from safetensors.torch import load_file

        self.model = nxd.NxDModel.load(str(art_dir / MODEL_FILE))
        if not isinstance(self.model, nxd.NxDModel):  # load() falls back to a bare TorchScript module on error
            raise RuntimeError(f"{art_dir / MODEL_FILE} did not load as an NxDModel (got {type(self.model).__name__}): "
                               f"rebuild the artifacts with the installed neuronx-distributed")
        self.model.set_weights([load_file(str(art_dir / WEIGHTS_DIR / f"tp{r}.safetensors"))
                                for r in range(manifest.tp)])
        self.model.to_neuron()
        self._warm_up()  # the manifest lists every graph (Manifest.check): prefill buckets and both decodes

    def _run(self, spec: GraphSpec, inputs):
        out = self.model.forward(*inputs, model_name=spec.tag)
        if not isinstance(out, (tuple, list)):
            return out
        return out[0] if spec.num_heads == 1 else tuple(out[: spec.num_heads])

    def _warm_up(self) -> None:
        """Run every graph once (the first call of each is slow); KV rows written here are replaced by the
        first prefill into them, and masks hide everything a row has not written."""
        specs = [self.spec(PREFILL, b) for b in self.buckets] + [self.spec(DECODE)]
        for spec in specs + ([self.spec(DECODE, 1, self.candidates)] if self.candidates else []):
            self._run(spec, tuple(t.zeros() for t in spec.host_inputs))

    def close(self) -> None:
        self.model = None
