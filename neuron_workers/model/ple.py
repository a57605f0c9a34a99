"""The per-layer-embedding (PLE) table, kept on the host and memory-mapped from safetensors.

E2B / E4B carry a [262144, L*256] table (4.7 / 5.6 GB in bf16). It is never copied into RAM:
the file is mapped copy-on-write, so every process that serves the model shares the page cache,
and a decode step touches one row per token. `lookup` returns the token-identity half of the HF
per-layer inputs (`Gemma4TextModel.get_per_layer_inputs`); the projection half runs in the graph.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

from neuron_workers.errors import UserError

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


class PleTable:
    def __init__(self, path: Path, key: str, num_layers: int, ple_dim: int, dtype: torch.dtype):
        self.path = Path(path)
        self.weight = _map_tensor(self.path, key)  # [vocab, L*ple_dim], no copy
        if self.weight.shape[1] != num_layers * ple_dim:
            raise UserError(f"{key} has width {self.weight.shape[1]}, config expects {num_layers}x{ple_dim}")
        self.num_layers, self.ple_dim, self.dtype = num_layers, ple_dim, dtype
        # HF's ScaledWordEmbedding multiplies by the scale cast to the weight dtype (M4 embed_scale).
        self.scale = torch.tensor(ple_dim**0.5, dtype=self.weight.dtype)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, S] -> [B, S, L, ple_dim] in the model dtype."""
        rows = self.weight.index_select(0, ids.reshape(-1).long()) * self.scale
        return rows.to(self.dtype).reshape(*ids.shape, self.num_layers, self.ple_dim)


def _map_tensor(path: Path, key: str) -> torch.Tensor:
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        entry = header.get(key)
        if entry is None:
            raise UserError(f"{key} not found in {path}")
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise UserError(f"{key} in {path} has unsupported dtype {entry['dtype']}")
        start, end = entry["data_offsets"]
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    offset = 8 + header_len + start
    count = (end - start) // torch.empty((), dtype=dtype).element_size()
    flat = torch.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    return flat.view(*entry["shape"])


def open_ple_table(info, dims, dtype: torch.dtype) -> PleTable | None:
    """The checkpoint's PLE table, or None for models without per-layer embeddings (12B)."""
    if not dims.ple_dim:
        return None
    key = info.prefix + "embed_tokens_per_layer.weight"
    if key not in info.weight_files:
        raise UserError(f"weights in {info.model_dir} lack {key} (the per-layer embedding table)")
    return PleTable(info.weight_files[key], key, dims.num_layers, dims.ple_dim, dtype)
