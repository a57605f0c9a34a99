"""What the host-cost benches share: the real E2B host-side sizes (vocabulary 262,144, PLE 35 x 256) as a
sparse on-disk PLE table and stand-in model dims, so a bench times the host work around a graph without one."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from neuron_workers.model.dims import SLIDING

VOCAB, LAYERS, PLE_DIM = 262_144, 35, 256
KEY = "model.language_model.embed_tokens_per_layer.weight"


def sparse_ple_file(path: Path) -> Path:
    """A safetensors file holding a [262144, 8960] bf16 table, sparse on disk."""
    nbytes = VOCAB * LAYERS * PLE_DIM * 2
    header = json.dumps({KEY: {"dtype": "BF16", "shape": [VOCAB, LAYERS * PLE_DIM], "data_offsets": [0, nbytes]}})
    header += " " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + nbytes)
    return path


class StandInDims:
    vocab_size, num_layers, ple_dim, sliding_window = VOCAB, LAYERS, PLE_DIM, 512
    final_logit_softcapping, kv_layers, layer_types = 30.0, (), (SLIDING,)

    @staticmethod
    def ring_size(max_context):
        return min(512, max_context)
