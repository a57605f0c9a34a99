"""The host encoders: transformers' own Gemma-4 media modules (E-models: the vision tower and the audio conformer,
each with its multimodal embedder; the 12B: the unified encoder-free projections), built from the checkpoint's
config and loaded with its weights, on the host CPU. One function per kind (`Encoders.image`, `Encoders.audio`):
the processor's tensors of one item in, its soft tokens' embeddings [N, hidden] out, exactly what transformers'
`get_image_features` / `get_audio_features` give (they run here, bound to this holder). A device graph can
replace either function later without the engine noticing."""

from __future__ import annotations

import torch
from torch import nn

from neuron_workers.errors import UserError

PARTS = ("vision_tower", "embed_vision", "audio_tower", "embed_audio")


class Encoders(nn.Module):
    def __init__(self, model_type: str, config, dtype: torch.dtype):
        super().__init__()
        self.config, self.unified = config, model_type != "gemma4"
        if self.unified:
            from transformers.models.gemma4_unified import modeling_gemma4_unified as mu

            self.model_cls = mu.Gemma4UnifiedModel
            self.embed_vision = mu.Gemma4UnifiedVisionEmbedder(config.vision_config, config.text_config) \
                if config.vision_config is not None else None
            self.embed_audio = mu.Gemma4UnifiedMultimodalEmbedder(config.audio_config, config.text_config) \
                if config.audio_config is not None else None
        else:
            from transformers import AutoModel
            from transformers.models.gemma4 import modeling_gemma4 as m4

            self.model_cls = m4.Gemma4Model
            vision, audio = config.vision_config, config.audio_config
            self.vision_tower = AutoModel.from_config(vision) if vision is not None else None
            self.audio_tower = AutoModel.from_config(audio) if audio is not None else None
            self.embed_vision = m4.Gemma4MultimodalEmbedder(vision, config.text_config) if vision is not None else None
            self.embed_audio = m4.Gemma4MultimodalEmbedder(audio, config.text_config) if audio is not None else None
        self.to(dtype).eval()

    def load(self, weight_files: dict) -> None:
        """Copy `model.<part>.*` of the checkpoint into every part; a missing or extra key fails loudly."""
        from safetensors import safe_open

        want = {f"model.{k}": v for k, v in self.state_dict().items()}
        missing = [k for k in want if k not in weight_files]
        if missing:
            raise UserError(f"the checkpoint lacks {len(missing)} media weights, e.g. {missing[:2]}")
        by_file: dict = {}
        for k in want:
            by_file.setdefault(weight_files[k], []).append(k)
        with torch.no_grad():
            for path, keys in by_file.items():
                with safe_open(str(path), "pt") as f:
                    for k in keys:
                        t = f.get_tensor(k)
                        if t.shape != want[k].shape:
                            raise UserError(f"{k}: checkpoint shape {tuple(t.shape)}, config {tuple(want[k].shape)}")
                        want[k].copy_(t.to(want[k].dtype))

    @torch.inference_mode()
    def image(self, pixel_values: torch.Tensor, image_position_ids: torch.Tensor) -> torch.Tensor:
        """One image's processor outputs ([1, patches, D], [1, patches, 2]) -> its soft tokens [N, hidden]."""
        out = self.model_cls.get_image_features(self, pixel_values, image_position_ids, return_dict=True)
        return torch.cat(out.pooler_output, dim=0)

    @torch.inference_mode()
    def audio(self, input_features: torch.Tensor, input_features_mask: torch.Tensor) -> torch.Tensor:
        """One clip's features ([1, frames, D], [1, frames]) -> its soft tokens [N, hidden] (padding dropped)."""
        out = self.model_cls.get_audio_features(self, input_features, input_features_mask, return_dict=True)
        return out.pooler_output[out.attention_mask.to(out.pooler_output.device)]


def has_media_weights(weight_files: dict) -> bool:
    return any(k.startswith(("model.embed_vision.", "model.embed_audio.")) for k in weight_files)
