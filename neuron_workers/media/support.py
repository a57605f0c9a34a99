"""MediaSupport: what the serve side calls (on the engine process's reader thread) to turn a rendered prompt and
its images / audio clips into prompt ids (each placeholder expanded by transformers' own Gemma-4 processor) and
encoded `MediaInput`s; and `check_media`, the engine's check of those items against the prompt ids."""

from __future__ import annotations

import numpy as np
import torch

from neuron_workers.errors import UserError
from neuron_workers.media.encoders import Encoders, has_media_weights
from neuron_workers.media.processor import load_processor
from neuron_workers.media.types import MediaInput, media_digest, soft_key

MAX_PIXELS = 16_777_216  # 4096 x 4096: larger images are refused before the processor resizes them
MAX_AUDIO_SECONDS = 30.0  # Gemma-4's audio limit


class MediaSupport:
    def __init__(self, processor, kinds: frozenset, encoders: Encoders, config, dtype: torch.dtype):
        self.processor, self.modalities, self.encoders = processor, kinds, encoders
        self.dtype = dtype
        self.bidirectional_images = getattr(config.get_text_config(), "use_bidirectional_attention", None) == "vision"
        self.ids = {"image": config.image_token_id, "audio": config.audio_token_id}
        self.begin = {"image": config.boi_token_id, "audio": config.boa_token_id}
        self.sampling_rate = int(processor.feature_extractor.sampling_rate)

    @property
    def limits(self) -> dict:
        out = {}
        if "image" in self.modalities:
            out["image"] = {"max_pixels": MAX_PIXELS}
        if "audio" in self.modalities:
            out["audio"] = {"max_seconds": MAX_AUDIO_SECONDS, "sampling_rate": self.sampling_rate}
        return out

    def placeholder(self, kind: str) -> str:
        return {"image": self.processor.image_token, "audio": self.processor.audio_token}[kind]

    def expand(self, text: str, images: list, audios: list) -> list[int]:
        """The prompt ids as transformers' processor gives them (each placeholder expanded to its soft tokens),
        without running the encoders (`/tokenize`)."""
        return self._process(text, images, audios)["input_ids"][0].tolist()

    def prepare(self, text: str, images: list, audios: list) -> tuple[list[int], list[MediaInput]]:
        """(prompt ids as transformers' processor gives them, the items encoded, in prompt order)."""
        out = self._process(text, images, audios)
        ids = out["input_ids"][0].tolist()
        found = {"image": [], "audio": []}
        for i, t in enumerate(ids[:-1]):
            for kind in found:
                if t == self.begin[kind] and ids[i + 1] == self.ids[kind]:
                    found[kind].append(i + 1)
        items = [self._image(out, j, off, images[j]) for j, off in enumerate(found["image"])]
        items += [self._audio(out, j, off, audios[j]) for j, off in enumerate(found["audio"])]
        items.sort(key=lambda m: m.offset)
        for m in items:
            if ids[m.offset:m.end] != [self.ids[m.kind]] * m.length:
                raise RuntimeError(f"the {m.kind} encoder gave {m.length} soft tokens, the processor another count")
        return ids, items

    def _process(self, text: str, images: list, audios: list) -> dict:
        """transformers' processor over the rendered prompt and its items (checked first)."""
        self._check(text, images, audios)
        bos = self.processor.tokenizer.bos_token
        kw = dict(text=[text], return_tensors="pt", add_special_tokens=not (bos and text.startswith(bos)))
        if images:
            kw["images"] = [[im.convert("RGB") for im in images]]
        if audios:
            kw["audio"] = [np.asarray(a, dtype=np.float32) for a in audios]
        try:
            return self.processor(**kw)
        except (ValueError, TypeError, OSError) as e:
            raise UserError(f"the media could not be processed: {e}") from None

    def _check(self, text: str, images: list, audios: list) -> None:
        for kind, items in (("image", images), ("audio", audios)):
            if items and kind not in self.modalities:
                raise UserError(f"this model takes no {kind} input")
            if text.count(self.placeholder(kind)) != len(items) if kind in self.modalities else False:
                raise UserError(f"the chat template wrote {text.count(self.placeholder(kind))} {kind} placeholders "
                                f"for {len(items)} {kind} items (a template may leave out media in some messages, "
                                "such as tool results; a text part may not spell a placeholder)")
        for im in images:
            if im.width * im.height > MAX_PIXELS:
                raise UserError(f"an image of {im.width}x{im.height} pixels is larger than {MAX_PIXELS} pixels")
        for a in audios:
            a = np.asarray(a)
            if a.ndim != 1 or not len(a):
                raise UserError("audio must be mono and not empty")
            if len(a) > MAX_AUDIO_SECONDS * self.sampling_rate:
                raise UserError(f"audio of {len(a) / self.sampling_rate:.1f} s is longer than {MAX_AUDIO_SECONDS} s")

    def _image(self, out, j: int, offset: int, image) -> MediaInput:
        embeds = self.encoders.image(out["pixel_values"][j:j + 1].to(self.dtype), out["image_position_ids"][j:j + 1])
        rgb = image.convert("RGB")
        digest = media_digest("image", f"{rgb.width}x{rgb.height}".encode() + rgb.tobytes())
        return MediaInput("image", offset, embeds.to(self.dtype), digest, self.bidirectional_images)

    def _audio(self, out, j: int, offset: int, audio) -> MediaInput:
        embeds = self.encoders.audio(out["input_features"][j:j + 1].to(self.dtype), out["input_features_mask"][j:j + 1])
        digest = media_digest("audio", np.asarray(audio, dtype=np.float32).tobytes())
        return MediaInput("audio", offset, embeds.to(self.dtype), digest, False)


def served_media_ids(info) -> tuple[int, ...]:
    """The soft-token ids (image, audio, video) of a checkpoint that serves media (its media weights and a
    processor config are there), without loading anything; () for a text-only one. A build traces `mm_embeds`
    for these (`compile build`), and serving from its artifacts loads the encoders."""
    from pathlib import Path

    from neuron_workers.model.loader import media_token_ids

    if info.model_type not in ("gemma4", "gemma4_unified") or not has_media_weights(info.weight_files) or \
            not (Path(info.model_dir) / "processor_config.json").is_file():
        return ()
    return media_token_ids(info)


def load_media(info, tokenizer, dtype: torch.dtype) -> MediaSupport | None:
    """The checkpoint's MediaSupport, or None when it has no media weights or processor config."""
    if tokenizer is None or info.model_type not in ("gemma4", "gemma4_unified") or \
            not has_media_weights(info.weight_files):
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(info.model_dir))
    processor, kinds = load_processor(info.model_dir, info.model_type, tokenizer)
    if processor is None:
        return None
    encoders = Encoders(info.model_type, config, dtype)
    encoders.load(info.weight_files)
    return MediaSupport(processor, kinds, encoders, config, dtype)


def check_media(prompt_ids: list[int], media: tuple, dims, prompt_logprobs, unit: int = 0) -> list[int]:
    """Raise a UserError unless the items sit on soft tokens of the prompt, in order, without overlap, and each
    bidirectional block fits one prefill piece (`unit` tokens, the prefill chunk; 0: whole prompts, and a reuse that
    would split a block prefills the prompt whole instead, `Scheduler._splits_a_block`); return the prompt's
    prefix-reuse keys (`Sequence.keys`: an item's soft tokens negative; soft tokens outside any item keep their id
    and are fed as pad, `Engine.new_sequence`)."""
    keys, soft = list(prompt_ids), set(dims.media_ids)
    end = 0
    for m in media:
        if m.offset < end or m.end > len(prompt_ids) or m.embeds.shape[-1] != dims.hidden_size:
            raise UserError(f"a {m.kind} item does not fit the prompt at {m.offset}", param="messages")
        if any(t not in soft for t in prompt_ids[m.offset:m.end]):
            raise UserError(f"a {m.kind} item's {m.length} soft tokens are not in the prompt at {m.offset}",
                            param="messages")
        if m.bidirectional and unit and m.length > unit:
            raise UserError(f"an image of {m.length} soft tokens is longer than this model's prefill chunk ({unit} "
                            "tokens), which must hold it whole; send a smaller image", param="messages")
        keys[m.offset:m.end] = [soft_key(m.digest, i) for i in range(m.length)]
        end = m.end
    if media and prompt_logprobs is not None:
        raise UserError("prompt logprobs are not available with images or audio", param="prompt_logprobs")
    return keys
