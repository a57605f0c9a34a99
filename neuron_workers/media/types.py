"""MediaInput: one image or audio clip of one prompt, encoded and ready for the engine (the contract between
`support.MediaSupport.prepare` and `Engine.new_sequence(..., media=...)`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MediaInput:
    kind: str  # "image" | "audio"
    offset: int  # index in the prompt ids of its first soft token (the token after <|image> / <|audio>)
    embeds: torch.Tensor  # [length, hidden_size] in the model dtype: what replaces the soft tokens' embeddings
    digest: bytes  # content hash of the decoded media (prefix reuse keys soft tokens by it)
    bidirectional: bool = False  # its soft tokens see each other both ways on sliding layers (the 12B's images)

    @property
    def length(self) -> int:
        return int(self.embeds.shape[0])

    @property
    def end(self) -> int:
        return self.offset + self.length


def soft_key(digest: bytes, index: int) -> int:
    """The prefix-cache key of soft token `index` of the item with `digest`: a negative int (never a token id), so
    two prompts share the token only when they carry the same item at that place."""
    h = hashlib.blake2b(digest + index.to_bytes(4, "little"), digest_size=7).digest()
    return -1 - int.from_bytes(h, "little")


def media_digest(kind: str, data: bytes) -> bytes:
    """Content hash of decoded media bytes (an image's RGB pixels with its size, or audio samples)."""
    return hashlib.blake2b(kind.encode() + b"\0" + data, digest_size=16).digest()
