"""The processor file of the tiny checkpoints (`processor_config.json`: the image processor's and the audio
feature extractor's settings, as the published checkpoints carry them): the image processor with 4 px patches
pooled 2 x 2 and at most 70 soft tokens an image (the smallest budget transformers accepts), the audio feature
extractor at its defaults (16 kHz; the E-models' 128 mel bins, the 12B's raw 40 ms frames)."""

from __future__ import annotations

import json
from pathlib import Path

IMAGE = dict(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
IMAGE_DEFAULTS = dict(do_convert_rgb=True, do_resize=True, do_rescale=True, rescale_factor=1 / 255,
                      do_normalize=False, resample=3)


def write_processor_files(path: Path, model_type: str) -> None:
    """Write `processor_config.json` of a `gemma4` (E-models) or `gemma4_unified` (12B-like) checkpoint."""
    if model_type == "gemma4":
        from transformers.models.gemma4 import Gemma4AudioFeatureExtractor as Extractor

        processor, image = "Gemma4Processor", "Gemma4ImageProcessorPil"
    else:
        from transformers.models.gemma4_unified import Gemma4UnifiedAudioFeatureExtractor as Extractor

        processor, image = "Gemma4UnifiedProcessor", "Gemma4UnifiedImageProcessor"
    extractor = Extractor().to_dict()
    extractor.pop("mel_filters", None)  # derived from the settings on load
    config = {"processor_class": processor, "image_seq_length": IMAGE["max_soft_tokens"],
              "audio_seq_length": 750, "audio_ms_per_token": 40,
              "feature_extractor": {**extractor, "feature_extractor_type": Extractor.__name__},
              "image_processor": {"image_processor_type": image, **IMAGE, **IMAGE_DEFAULTS}}
    (path / "processor_config.json").write_text(json.dumps(config, indent=1, default=_plain))


def _plain(x):
    return x.tolist() if hasattr(x, "tolist") else str(x)
