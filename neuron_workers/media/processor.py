"""transformers' own Gemma-4 processor for a checkpoint directory, built offline from its `processor_config.json`,
its tokenizer and the PIL image processor (no torchvision: `Gemma4Processor` insists on a video processor, which
is torchvision-only; videos are not served, so `_NoVideo` accepts none). The 12B's unified image processor is
torchvision-only too: without torchvision it is our torch-only port (`unified_image.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from neuron_workers.errors import UserError


def _no_video(cls):
    class NoVideo(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return NoVideo


def load_processor(model_dir: str | Path, model_type: str, tokenizer):
    """(processor, kinds it takes) for `model_dir`, or (None, frozenset()) when it has no processor config."""
    path = Path(model_dir) / "processor_config.json"
    if not path.is_file():
        return None, frozenset()
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None
    image_cfg = {k: v for k, v in cfg.get("image_processor", {}).items() if k != "image_processor_type"}
    extractor_cfg = {k: v for k, v in cfg.get("feature_extractor", {}).items()
                     if k not in ("feature_extractor_type", "frame_length", "hop_length", "fft_length")}
    extra = {k: cfg[k] for k in ("image_seq_length", "audio_seq_length", "audio_ms_per_token") if k in cfg}
    if model_type == "gemma4":
        from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil, Gemma4Processor

        proc = _no_video(Gemma4Processor)(feature_extractor=Gemma4AudioFeatureExtractor(**extractor_cfg),
                                          image_processor=Gemma4ImageProcessorPil(**image_cfg), tokenizer=tokenizer,
                                          video_processor=None, **extra)
        return proc, frozenset({"image", "audio"})
    from transformers.models.gemma4 import Gemma4ImageProcessorPil
    from transformers.models.gemma4_unified import Gemma4UnifiedAudioFeatureExtractor, Gemma4UnifiedProcessor

    image, kinds = _unified_image_processor(image_cfg)
    proc = _no_video(Gemma4UnifiedProcessor)(
        feature_extractor=Gemma4UnifiedAudioFeatureExtractor(**extractor_cfg),
        image_processor=image or Gemma4ImageProcessorPil(**image_cfg), tokenizer=tokenizer, video_processor=None,
        **extra)
    return proc, kinds


def _unified_image_processor(image_cfg: dict):
    """transformers' unified image processor where torchvision is installed, else our torch-only port of it
    (`unified_image.py`, equal bit for bit); images and audio either way."""
    try:
        from transformers.models.gemma4_unified.image_processing_gemma4_unified import Gemma4UnifiedImageProcessor
    except ImportError:
        from neuron_workers.media.unified_image import UnifiedImageProcessor as Gemma4UnifiedImageProcessor
    return Gemma4UnifiedImageProcessor(**image_cfg), frozenset({"image", "audio"})
