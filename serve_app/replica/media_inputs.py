"""A request's images and audio clips decoded for the model (in the engine process, on its reader thread, never on
an event loop): `events.MediaPart`s become PIL images and float32 mono arrays at the processor's sampling rate.

- Images: the bytes of a data: URL, or of an http(s) URL fetched here when its host is one the model's config
  allows (`media_hosts`; no redirects, `media_fetch_timeout_s`, at most `MAX_MEDIA_BYTES`). The size in pixels is
  read from the header and checked before the pixels are decoded; a file Pillow cannot decode (truncated, not an
  image) is refused.
- Audio: PCM wav (the standard library's `wave`), its length checked from the header before the samples are read,
  channels averaged to mono, resampled to the processor's rate by FFT (band-limited) when it differs.
Every refusal is a UserError naming the request field the item came from (`MediaPart.param`)."""

from __future__ import annotations

import io
import urllib.error
import urllib.parse
import urllib.request
import wave
from dataclasses import dataclass

from neuron_workers.errors import UserError
from serve_app.events import MAX_MEDIA_BYTES

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


@dataclass(frozen=True)
class MediaPolicy:
    """Where image / audio URLs may come from (a model's `media_hosts`; none: data: URLs only)."""

    hosts: tuple[str, ...] = ()
    timeout_s: float = 10.0

    @classmethod
    def of(cls, spec) -> "MediaPolicy":
        return cls(tuple(h.lower() for h in getattr(spec, "media_hosts", ()) or ()),
                   float(getattr(spec, "media_fetch_timeout_s", 10.0)))


def load_media(parts, support, policy: MediaPolicy) -> tuple[list, list]:
    """(images, audio arrays) of `parts`, each list in request order; `support`: the engine's `MediaSupport` (None:
    the model takes no media)."""
    images, audios = [], []
    for p in parts:
        if support is None or p.kind not in support.modalities:
            raise UserError(f"this model takes no {p.kind} input", param=p.param)
        data = fetch(p.url, p.param, policy) if p.url else p.data
        if p.kind == "image":
            images.append(decode_image(data, p.param, support.limits["image"]["max_pixels"]))
        else:
            lim = support.limits["audio"]
            audios.append(decode_wav(data, p.param, lim["max_seconds"], lim["sampling_rate"]))
    return images, audios


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a redirect could leave the allowed hosts: it is an error instead


def fetch(url: str, param: str, policy: MediaPolicy) -> bytes:
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host not in policy.hosts:
        raise UserError(f"this server fetches no media from {host[:100]!r}: send the image as a data: URL "
                        "(operators allow hosts with `media_hosts`)", param=param)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers={"User-Agent": "gemma4-inf2"}),
                         timeout=policy.timeout_s) as resp:
            data = resp.read(MAX_MEDIA_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise UserError(f"fetching the URL failed: HTTP {e.code}", param=param) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise UserError(f"fetching the URL failed: {str(getattr(e, 'reason', e))[:200]}", param=param) from None
    if len(data) > MAX_MEDIA_BYTES:
        raise UserError(f"the URL's content is larger than {MAX_MEDIA_BYTES // (1024 * 1024)} MiB", param=param)
    return data


def decode_image(data: bytes, param: str, max_pixels: int):
    """A PIL image, its pixels loaded; refused when it is not an image Pillow reads or has more than `max_pixels`."""
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError:
        raise UserError(f"the image is larger than {max_pixels} pixels", param=param) from None
    except (OSError, SyntaxError, ValueError):
        raise UserError(f"not an image this server decodes ({', '.join(IMAGE_FORMATS)})", param=param) from None
    if im.width * im.height > max_pixels:
        raise UserError(f"an image of {im.width}x{im.height} pixels is larger than {max_pixels} pixels",
                        param=param)
    try:
        im.load()
    except (OSError, SyntaxError, ValueError, EOFError):
        raise UserError("the image could not be decoded (truncated or corrupt)", param=param) from None
    return im


def decode_wav(data: bytes, param: str, max_seconds: float, rate: int):
    """float32 mono samples at `rate` of a PCM wav file (a numpy array); refused when longer than `max_seconds` or
    not PCM wav. numpy is imported here, not with the module: the engine process pins its CPUs after its imports,
    and numpy's BLAS threads start at import."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            channels, width, src_rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if src_rate <= 0 or not channels or width not in (1, 2, 3, 4):
                raise wave.Error(f"{channels} channels of {8 * width}-bit samples at {src_rate} Hz")
            if frames / src_rate > max_seconds:
                raise UserError(f"audio of {frames / src_rate:.1f} s is longer than {max_seconds:g} s", param=param)
            raw = w.readframes(frames)
    except (wave.Error, EOFError, OSError, ValueError) as e:
        raise UserError(f"not a PCM wav file this server decodes ({str(e)[:100]})", param=param) from None
    samples = pcm_to_float(raw, width).reshape(-1, channels).mean(axis=1)
    if not len(samples):
        raise UserError("the audio has no samples", param=param)
    return resample(samples, src_rate, rate).astype("float32")


def pcm_to_float(raw: bytes, width: int):
    """Interleaved PCM samples of `width` bytes as float64 in [-1, 1)."""
    import numpy as np

    n = len(raw) // width
    if width == 1:  # 8-bit wav is unsigned
        return (np.frombuffer(raw, np.uint8, n).astype(np.float64) - 128) / 128
    if width == 3:  # 24-bit little-endian: widen to int32
        b = np.frombuffer(raw, np.uint8, 3 * n).reshape(n, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        return np.where(v >= 1 << 23, v - (1 << 24), v).astype(np.float64) / (1 << 23)
    if width not in (2, 4):
        raise ValueError(f"{8 * width}-bit samples")
    dtype = np.int16 if width == 2 else np.int32
    return np.frombuffer(raw, dtype, n).astype(np.float64) / float(np.iinfo(dtype).max + 1)


def resample(x, src: int, dst: int):
    """`x` at `src` Hz resampled to `dst` Hz by truncating / zero-padding its spectrum (band-limited)."""
    import numpy as np

    if src == dst:
        return x
    n = max(int(round(len(x) * dst / src)), 1)
    spec = np.fft.rfft(x)
    keep = min(len(spec), n // 2 + 1)
    out = np.zeros(n // 2 + 1, dtype=complex)
    out[:keep] = spec[:keep]
    return np.fft.irfft(out, n) * (n / len(x))
