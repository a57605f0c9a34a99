"""Our torch-only port of the 12B's image processor (`neuron_workers/media/unified_image.py`) gives what
transformers' torchvision `Gemma4UnifiedImageProcessor` gives, bit for bit: pixel patches, their positions and the
soft-token counts, on images of many sizes, aspect ratios and modes, with the tiny 12B's config and the real one.
Needs torchvision (CI's xla tier installs it; skipped where it is absent)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from neuron_workers.media.unified_image import UnifiedImageProcessor

pytest.importorskip("torchvision")
from transformers.models.gemma4_unified.image_processing_gemma4_unified import (  # noqa: E402
    Gemma4UnifiedImageProcessor,
)

from neuron_workers.testing.media_files import IMAGE, IMAGE_DEFAULTS  # noqa: E402


def picture(seed: int, w: int, h: int, mode: str = "RGB") -> Image.Image:
    arr = np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8)
    im = Image.fromarray(arr)
    if mode == "RGBA":
        im = im.convert("RGBA")
        im.putalpha(Image.fromarray(np.random.RandomState(seed + 1).randint(0, 256, (h, w), dtype=np.uint8)))
        return im
    return im.convert(mode)


IMAGES = [picture(1, 5, 7), picture(2, 48, 48), picture(3, 97, 31), picture(4, 1000, 700), picture(5, 64, 480),
          picture(6, 333, 222, "L"), picture(7, 120, 90, "RGBA"), picture(8, 200, 150, "P"), picture(9, 2048, 20)]
CONFIGS = {"tiny 12B": {**IMAGE, **IMAGE_DEFAULTS},  # what the tiny checkpoints' processor_config.json holds
           "real 12B": {}}  # transformers' defaults: 16 px patches, 3x3 pooling, 280 soft tokens


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("budget", [None, 70, 1120])
def test_the_port_equals_transformers_torchvision_processor(config, budget):
    cfg = dict(CONFIGS[config], **({"max_soft_tokens": budget} if budget else {}))
    ours, theirs = UnifiedImageProcessor(**cfg), Gemma4UnifiedImageProcessor(**cfg)
    for im in IMAGES:
        a, b = ours(im, return_tensors="pt"), theirs(im, return_tensors="pt")
        assert set(a.keys()) == set(b.keys())
        assert a["num_soft_tokens_per_image"] == b["num_soft_tokens_per_image"], im.size
        for key in ("pixel_values", "image_position_ids"):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (im.size, im.mode, key)
    batch_a, batch_b = ours(IMAGES[:4], return_tensors="pt"), theirs(IMAGES[:4], return_tensors="pt")
    assert torch.equal(batch_a["pixel_values"], batch_b["pixel_values"])
