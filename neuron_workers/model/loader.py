"""One call from a checkpoint directory to everything a worker needs: HF text model (graph weights),
ModelDims, the host PLE table, the tokenizer (optional) and the stop ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from neuron_workers.model.checkpoint import CheckpointInfo, build_text_model, read_checkpoint_info
from neuron_workers.model.dims import ModelDims
from neuron_workers.model.ple import PleTable, open_ple_table

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float64": torch.float64}  # float64: CPU only, for exactness checks
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


@dataclass
class LoadedModel:
    info: CheckpointInfo
    dims: ModelDims
    hf_lm: torch.nn.Module
    ple: PleTable | None
    tokenizer: object | None
    dtype: torch.dtype

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.info.eos_token_ids

    @property
    def soft_ids(self) -> tuple[int, ...]:
        """The media soft-token ids of a multimodal checkpoint (image, audio, video): outside an image / audio
        item, transformers embeds them (and looks up their PLE rows) as the pad token, and so does the engine."""
        return media_token_ids(self.info)


def media_token_ids(info: CheckpointInfo) -> tuple[int, ...]:
    import json

    path = Path(info.model_dir) / "config.json"
    if info.model_type not in ("gemma4", "gemma4_unified") or not path.is_file():
        return ()
    raw = json.loads(path.read_text())
    ids = (raw.get("image_token_id"), raw.get("audio_token_id"), raw.get("video_token_id"))
    vocab = raw.get("text_config", {}).get("vocab_size", 0)
    return tuple(i for i in ids if isinstance(i, int) and 0 <= i < vocab)


def load_tokenizer(model_dir: str | Path):
    """The checkpoint's tokenizer, or None when the directory has no tokenizer files."""
    model_dir = Path(model_dir)
    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32, with_weights: bool = True) -> LoadedModel:
    info = read_checkpoint_info(model_dir)
    dims = ModelDims.from_hf(info.text_config)
    hf_lm = build_text_model(info, dtype) if with_weights else None
    return LoadedModel(info, dims, hf_lm, open_ple_table(info, dims, dtype), load_tokenizer(model_dir), dtype)
