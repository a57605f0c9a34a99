"""The 12B's image processor without torchvision: what transformers 5.23's `Gemma4UnifiedImageProcessor`
(models/gemma4_unified/image_processing_gemma4_unified.py, a torchvision-only class) computes, bit for bit, with
torch alone. Its only torchvision call is the aspect-ratio-preserving resize, `tvF.resize(uint8 image, bicubic,
antialias=True)`, which on CPU is `torch.nn.functional.interpolate` on the uint8 tensor itself (torchvision 0.24,
`transforms/v2/functional/_geometry.py`, `resize_image`: bicubic takes the native uint8 kernel on CPU); the
patchify / 3x3 merge / pad helpers below are transformers' own, copied from that module because it imports
torchvision at its top. tests/media/test_unified_image.py compares the two where torchvision is installed (CI's
xla tier)."""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_transforms import convert_to_rgb as convert_to_rgb_pil
from transformers.models.gemma4 import Gemma4ImageProcessorPil
from transformers.models.gemma4_unified.processing_gemma4_unified import get_aspect_ratio_preserving_size

SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)


class UnifiedImageProcessor(Gemma4ImageProcessorPil):
    """`Gemma4UnifiedImageProcessor` on torch tensors (the PIL Gemma-4 class gives the kwargs and validation)."""

    size = None
    default_to_square = True

    def process_image(self, image, do_convert_rgb=None, input_data_format=None, **kwargs) -> torch.Tensor:
        """A PIL image as TorchvisionBackend.process_image makes it: RGB uint8 [3, H, W], contiguous."""
        import numpy as np

        array = convert_to_rgb_pil(image, return_numpy=True) if do_convert_rgb else np.array(image)
        return torch.from_numpy(array).permute(2, 0, 1).contiguous()

    def _preprocess(self, images: list, do_resize: bool, resample, do_rescale: bool, rescale_factor: float,
                    do_normalize: bool, image_mean, image_std, return_tensors=None, patch_size: int | None = None,
                    max_soft_tokens: int | None = None, pooling_kernel_size: int | None = None,
                    **kwargs) -> BatchFeature:
        if max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
            raise ValueError(f"`max_soft_tokens` must be one of {SUPPORTED_SOFT_TOKENS}, got {max_soft_tokens}.")
        max_patches = max_soft_tokens * pooling_kernel_size**2
        pixel_values, position_ids, counts = [], [], []
        for image in images:
            if do_resize:
                size = get_aspect_ratio_preserving_size(height=image.shape[-2], width=image.shape[-1],
                                                        patch_size=patch_size, max_patches=max_patches,
                                                        pooling_kernel_size=pooling_kernel_size)
                image = resize_uint8_bicubic(image, size)
            if do_normalize:
                raise ValueError("the 12B's image processor does not normalize (do_normalize: false)")
            if do_rescale:
                image = image * rescale_factor
            teacher = convert_image_to_patches(image, patch_size)
            grid = torch.meshgrid(torch.arange(image.shape[-1] // patch_size),
                                  torch.arange(image.shape[-2] // patch_size), indexing="xy")
            positions = torch.stack(grid, dim=-1).reshape(teacher.shape[0], 2)
            merged, merged_pos = patches_merge(teacher[None], positions[None],
                                               teacher.shape[0] // pooling_kernel_size**2)
            counts.append(merged.shape[1])
            merged, merged_pos = pad_along_first_dim(merged[0], merged_pos[0], max_soft_tokens)
            pixel_values.append(merged)
            position_ids.append(merged_pos)
        data = {"pixel_values": torch.stack(pixel_values), "image_position_ids": torch.stack(position_ids),
                "num_soft_tokens_per_image": counts}
        return BatchFeature(data=data, tensor_type=return_tensors)


def resize_uint8_bicubic(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """torchvision 0.24's `resize_image` for a uint8 [C, H, W] CPU tensor, bicubic, antialias (its restride of a
    channels-last 1CHW view included)."""
    c, h, w = image.shape
    if tuple(size) == (h, w):
        return image
    x = image.reshape(-1, c, h, w)
    strides = x.stride()
    if x.is_contiguous(memory_format=torch.channels_last) and x.shape[0] == 1 and x.numel() != strides[0]:
        x = x.as_strided((1, c, h, w), [x.numel(), *strides[1:]])
    out = torch.nn.functional.interpolate(x, size=list(size), mode="bicubic", align_corners=False, antialias=True)
    return out.reshape(c, *size)


def convert_image_to_patches(image: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(C, H, W) -> (H/p * W/p, p * p * C) (transformers' own)."""
    c, h, w = image.shape
    patched = image.reshape(c, h // patch_size, patch_size, w // patch_size, patch_size).permute(1, 3, 2, 4, 0)
    return patched.reshape((h // patch_size) * (w // patch_size), -1)


def pad_along_first_dim(image: torch.Tensor, positions: torch.Tensor, target_length: int):
    """Zero patches and -1 positions up to `target_length` (transformers' own)."""
    padding_length = target_length - image.shape[0]
    if padding_length > 0:
        image = torch.nn.functional.pad(image, [0, 0] * (image.ndim - 1) + [0, padding_length], value=0)
        positions = torch.nn.functional.pad(positions, (0, 0, 0, padding_length), value=-1)
    return image, positions


def patches_merge(patches: torch.Tensor, positions_xy: torch.Tensor, length: int):
    """k x k neighbouring patches merged into one, in kernel order, with the kernel's least position (transformers'
    own `patches_merge`, shapes (*, L, D) / (*, L, 2) -> (*, length, k*k*D) / (*, length, 2))."""
    patch_size = math.isqrt(patches.shape[-1] // 3)
    k = math.isqrt(patches.shape[-2] // length)
    if patch_size * patch_size * 3 != patches.shape[-1] or k * k * length != patches.shape[-2]:
        raise ValueError(f"Cannot merge {tuple(patches.shape)} to {length}")
    max_x = positions_xy[..., 0].max(dim=-1, keepdim=True)[0] + 1
    kernel_idxs = torch.div(positions_xy, k, rounding_mode="floor")
    from_top_left = k * k * kernel_idxs[..., 0] + k * max_x * kernel_idxs[..., 1]
    within = torch.remainder(positions_xy, k)
    perm = (within[..., 0] + within[..., 1] * k + from_top_left).long().argsort(dim=-1)
    ordered = patches.gather(-2, perm.unsqueeze(-1).expand_as(patches))
    batch = patches.shape[:-2]
    ordered = ordered.reshape(*batch, length, k, k, patch_size, patch_size, 3)
    ordered = ordered.permute(*range(len(batch)), -6, -5, -3, -4, -2, -1)
    merged = ordered.reshape(*batch, length, k * patch_size * k * patch_size * 3)
    pos = positions_xy.float().gather(-2, perm.unsqueeze(-1).expand_as(positions_xy).long())
    pad = (positions_xy == -1).all(dim=-1, keepdim=True)
    pos = pos * (~pad).float() + positions_xy.float() * pad.float()
    new_positions = torch.div(pos.reshape(*batch, length, k * k, 2), k, rounding_mode="floor")
    return merged, new_positions.min(dim=-2)[0].to(torch.long)
