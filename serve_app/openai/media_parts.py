"""Image and audio content parts at the HTTP boundary: their request models (chat's `image_url` and
`input_audio` parts, which the Responses and Anthropic adapters map theirs onto), their limits, and `media_of`,
which turns a chat's parts into `events.MediaPart`s in prompt order, each naming its request field
(`messages.0.content.1.image_url`) so a 400 about it can say which.

Here a `data:` URL is decoded (base64, its media type checked, its size bounded) and an http(s) URL is passed on
as it is: the replica fetches it, and only from the hosts its config allows (`serve_app/replica/media_inputs.py`),
where the image or audio is decoded too (pixels and seconds are checked there, off the router's event loop).
Pure Python: the router imports no image library."""

from __future__ import annotations

import base64
import binascii
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.events import MAX_MEDIA_BYTES, MediaPart
from serve_app.openai.constraints import ConstraintError

MAX_MEDIA_ITEMS = 16  # images and audio clips in one request, together
AUDIO_FORMATS = ("wav",)  # what the replica decodes (the standard library's `wave`; no mp3 decoder is installed)
PARTS = ConfigDict(extra="ignore", strict=True)


class ImageURL(BaseModel):
    model_config = PARTS

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageURLPart(BaseModel):
    model_config = PARTS

    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(BaseModel):
    model_config = PARTS

    data: str = Field(description="base64 of the audio file")
    format: str = Field(description="wav")


class InputAudioPart(BaseModel):
    model_config = PARTS

    type: Literal["input_audio"]
    input_audio: InputAudio


def media_of(messages) -> tuple[MediaPart, ...]:
    """The image and audio parts of chat `messages` (`protocol.ChatMessage`), in the order the chat template
    renders them; a 400 naming the part when one is malformed or there are too many."""
    out = []
    for i, m in enumerate(messages):
        for j, p in enumerate(m.content if isinstance(m.content, list) else ()):
            if isinstance(p, (ImageURLPart, InputAudioPart)):
                if m.role not in ("user", "tool"):
                    raise ConstraintError(f"messages.{i}.content.{j}", "images and audio go in user or tool messages, "
                                                                       f"not in the {m.role} message")
                out.append(part(p, f"messages.{i}.content.{j}"))
    if len(out) > MAX_MEDIA_ITEMS:
        raise ConstraintError("messages", f"a request takes at most {MAX_MEDIA_ITEMS} images and audio clips, got "
                                          f"{len(out)}")
    return tuple(out)


def part(p, at: str) -> MediaPart:
    if isinstance(p, ImageURLPart):
        return image_part(p.image_url.url, f"{at}.image_url")
    fmt = p.input_audio.format.lower()
    if fmt not in AUDIO_FORMATS:
        raise ConstraintError(f"{at}.input_audio.format", f"audio format {p.input_audio.format[:20]!r} is not "
                                                          f"supported: send {' or '.join(AUDIO_FORMATS)}")
    return MediaPart("audio", f"{at}.input_audio", data=b64(p.input_audio.data, f"{at}.input_audio.data"),
                     format=fmt)


def image_part(url: str, param: str) -> MediaPart:
    """An image given by URL: a `data:image/...;base64,` URL decoded here, an http(s) URL for the replica."""
    if url.startswith(("http://", "https://")):
        if len(url) > 8192:
            raise ConstraintError(param, "the image URL is longer than 8192 characters")
        return MediaPart("image", param, url=url)
    if not url.startswith("data:"):
        raise ConstraintError(param, "an image URL must be a data: URL (data:image/png;base64,...) or an http(s) "
                                     "URL")
    head, sep, payload = url.partition(",")
    mime = head[5:].split(";")[0].strip().lower()
    if not sep or not head.endswith(";base64"):
        raise ConstraintError(param, "a data: URL must be base64 (data:image/png;base64,...)")
    if not mime.startswith("image/"):
        raise ConstraintError(param, f"the data: URL holds {mime[:40] or 'no media type'!r}, not an image "
                                     "(image/png, image/jpeg, ...)")
    return MediaPart("image", param, data=b64(payload, param), format=mime[6:])


def b64(text: str, param: str) -> bytes:
    """`text` base64-decoded (strictly), at most MAX_MEDIA_BYTES."""
    if len(text) > (MAX_MEDIA_BYTES + 2) // 3 * 4 + 8:
        raise ConstraintError(param, f"the item is larger than {MAX_MEDIA_BYTES // (1024 * 1024)} MiB")
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConstraintError(param, f"{param} is not valid base64") from None
    if not data:
        raise ConstraintError(param, f"{param} is empty")
    if len(data) > MAX_MEDIA_BYTES:
        raise ConstraintError(param, f"the item is larger than {MAX_MEDIA_BYTES // (1024 * 1024)} MiB")
    return data


def template_content(content) -> str | list[dict]:
    """A message's content for the chat template: a string, or (with media) a list of `{"type": "text", "text"}`,
    `{"type": "image"}` and `{"type": "audio"}` items, which the published Gemma-4 templates render as their
    placeholders."""
    if isinstance(content, str):
        return content
    if not any(isinstance(p, (ImageURLPart, InputAudioPart)) for p in content):
        return "".join(p.text for p in content)
    return [{"type": "image"} if isinstance(p, ImageURLPart) else {"type": "audio"}
            if isinstance(p, InputAudioPart) else {"type": "text", "text": p.text} for p in content]
