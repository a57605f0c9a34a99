"""What the host-cost benches share: the real E2B host-side sizes (vocabulary 262,144, PLE 35 x 256) as a
sparse on-disk PLE table, stand-in model dims and a stand-in backend, so a bench times the host work around a
graph without one."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from neuron_workers.model.dims import SLIDING
from neuron_workers.model.spec import Candidates, make_spec

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


class StandInBackend:
    """Precomputed bf16 logits [B, vocab] (cycled) in place of the graphs; with `candidates` K it also serves
    the top-K `decode` graph's candidates (computed once, as the device would). `favour` puts each step's
    argmax on a token a small tokenizer can decode."""

    def __init__(self, max_batch: int, candidates: int = 0, favour: bool = False, max_context: int = 4096):
        self.max_context, self.buckets, self.max_batch, self.candidates = max_context, (128,), max_batch, candidates
        g = torch.Generator().manual_seed(0)
        self.logits = [torch.randn(max_batch, VOCAB, generator=g).to(torch.bfloat16) for _ in range(16)]
        for i, z in enumerate(self.logits if favour else []):
            z[:, 300 + i * 7] = 12.0
        self.top = [Candidates(v, i.int()) for v, i in (z.topk(candidates, dim=1) for z in self.logits)] \
            if candidates else []
        self.i = 0

    def spec(self, phase, bucket=1):
        return make_spec(StandInDims, phase, self.max_batch, bucket, self.max_context, torch.bfloat16)

    def prefill(self, bucket, inputs):
        return self.logits[0][:1]

    def decode(self, inputs):
        self.i = (self.i + 1) % len(self.logits)
        return self.logits[self.i]

    def decode_candidates(self, inputs):
        self.i = (self.i + 1) % len(self.top)
        return self.top[self.i]

    def close(self):
        pass
