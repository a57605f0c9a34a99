"""Images and audio through the serve path's prepare step: a chat request with `image_url` / `input_audio` parts,
validated as the router does and prepared as the replica does, gives the ids transformers' processor gives for the
rendered chat and the greedy tokens transformers' `generate` gives; `/tokenize` counts the soft tokens; bad media
(truncated, too many pixels, too long, not an image, a host not allowed) are refusals naming the part."""

from __future__ import annotations

import base64
import http.server
import io
import struct
import threading
import wave
import zlib

import numpy as np
import pytest
from PIL import Image

from neuron_workers.config import EngineConfig
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine
from serve_app.events import MediaPart
from serve_app.openai.protocol import ChatRequest
from serve_app.openai.tokenize import TokenizeRequest
from serve_app.replica import prepare
from serve_app.replica.media_inputs import MediaPolicy, decode_wav, load_media, resample
from serve_app.replica.render import render

from conftest import hf_reference

N = 6


def png(seed: int, size=(24, 18), mode="RGB") -> bytes:
    arr = np.random.RandomState(seed).randint(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(b, "PNG")
    return b.getvalue()


def wav(seconds: float, rate: int = 16000, width: int = 2, channels: int = 1, seed: int = 0) -> bytes:
    n = int(seconds * rate)
    x = np.random.RandomState(seed).randint(-2000, 2000, n * channels)
    raw = {1: (x // 64 + 128).astype(np.uint8).tobytes(), 2: x.astype("<i2").tobytes(),
           4: (x * 65536).astype("<i4").tobytes()}[width]
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return b.getvalue()


def data_url(data: bytes, mime="image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(*parts, text="Describe it.") -> dict:
    content = [{"type": "text", "text": text}, *parts]
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": N,
            "temperature": 0, "ignore_eos": True}


def image_part(data: bytes, mime="image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data, mime)}}


def audio_part(data: bytes) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


@pytest.fixture(scope="module")
def eng(tiny_dirs):
    return build_engine(EngineConfig(model=str(tiny_dirs["gemma4-e2b-tiny"]), max_context=512))


@pytest.fixture(scope="module")
def hf_e2b(tiny_dirs):
    return hf_reference(tiny_dirs["gemma4-e2b-tiny"])


def generate(eng, body: dict) -> tuple[list[int], list[int]]:
    seq, _ = prepare.new_sequence(eng, ChatRequest.model_validate(body).payload())
    return list(seq.prompt_ids), [ev.token_id for ev in eng.run_all([seq]) if getattr(ev, "token_id", None)
                                  is not None]


def hf_generate(model, eng, body: dict, images=(), audios=()) -> tuple[list[int], list[int]]:
    req = ChatRequest.model_validate(body).payload()
    text = render(eng, list(req.messages), None, add_generation_prompt=True)
    kw = dict(text=[text], return_tensors="pt", add_special_tokens=False)
    if images:
        kw["images"] = [[Image.open(io.BytesIO(b)).convert("RGB") for b in images]]
    if audios:
        kw["audio"] = [decode_wav(a, "x", 30, 16000) for a in audios]
    inputs = eng.media.processor(**kw)
    out = hf_generate_ids(model, inputs)
    return inputs["input_ids"][0].tolist(), out


def hf_generate_ids(model, inputs) -> list[int]:
    out = model.generate(**inputs, do_sample=False, max_new_tokens=N, min_new_tokens=N, pad_token_id=0)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_chat_with_an_image_and_audio_equals_transformers(eng, hf_e2b):
    image, clip = png(1), wav(0.4)
    body = chat(image_part(image), {"type": "text", "text": " and "}, audio_part(clip))
    ids, out = generate(eng, body)
    hf_ids, hf_out = hf_generate(hf_e2b, eng, body, [image], [clip])
    assert ids == hf_ids and out == hf_out
    soft = eng.media.ids
    assert ids.count(soft["image"]) > 0 and ids.count(soft["audio"]) > 0


def test_different_images_give_different_answers_the_same_image_the_same(eng):
    a1, b = generate(eng, chat(image_part(png(1)))), generate(eng, chat(image_part(png(7))))
    a2 = generate(eng, chat(image_part(png(1))))
    assert a1 == a2 and a1[1] != b[1]


def test_tokenize_counts_the_soft_tokens(eng):
    body = chat(image_part(png(2, (40, 16))), audio_part(wav(0.3)))
    ids, _ = generate(eng, body)
    tok = TokenizeRequest.model_validate({"model": "m", "messages": body["messages"]})
    out = prepare.tokenize(eng, *tok.call_args())
    assert out["count"] == len(ids) and out["tokens"] == ids
    text_only = prepare.tokenize(eng, *TokenizeRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Describe it."}]}).call_args())
    assert out["count"] > text_only["count"] + 2


def truncated_png() -> bytes:
    return png(3, (64, 64))[:200]


def huge_png(width=8000, height=6250) -> bytes:
    """A PNG whose header says width x height (50 megapixels) over a few bytes of data."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


@pytest.mark.parametrize("part,needle", [
    (image_part(truncated_png()), "truncated"),
    (image_part(huge_png()), "8000x6250"),
    (image_part(b"GIF89a not really"), "not an image"),
    (audio_part(wav(600, rate=8000, width=1)), "600.0 s is longer than 30 s"),
    (audio_part(b"RIFF....WAVEfmt nonsense"), "not a PCM wav"),
    ({"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}, "fetches no media"),
], ids=["truncated png", "50 megapixels", "not an image", "10 minutes of audio", "not wav", "host not allowed"])
def test_bad_media_is_refused_naming_the_part_and_the_engine_carries_on(eng, part, needle):
    with pytest.raises(UserError, match=needle) as e:
        prepare.new_sequence(eng, ChatRequest.model_validate(chat(part)).payload())
    assert e.value.param.startswith("messages.0.content.1.")
    ids, out = generate(eng, chat(image_part(png(1))))  # the next request is served as usual
    assert len(out) == N


def test_a_model_without_the_modality_refuses_it_by_name():
    class AudioOnly:
        modalities = frozenset({"audio"})
    parts = (MediaPart("image", "messages.0.content.1.image_url", data=png(1)),)
    with pytest.raises(UserError, match="takes no image input") as e:
        load_media(parts, AudioOnly(), MediaPolicy())
    assert e.value.param == "messages.0.content.1.image_url"
    with pytest.raises(UserError, match="takes no audio input"):
        load_media((MediaPart("audio", "p", data=wav(0.1)),), None, MediaPolicy())


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/cat.png":
            body = png(5)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:  # a redirect elsewhere
            self.send_response(302)
            self.send_header("Location", "http://example.com/cat.png")
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_image_urls_are_fetched_from_allowed_hosts_only(eng, image_server):
    url = {"type": "image_url", "image_url": {"url": f"{image_server}/cat.png"}}
    allowed = MediaPolicy(hosts=("127.0.0.1",), timeout_s=5)
    seq, _ = prepare.new_sequence(eng, ChatRequest.model_validate(chat(url)).payload(), allowed)
    same, _ = prepare.new_sequence(eng, ChatRequest.model_validate(chat(image_part(png(5)))).payload())
    assert seq.prompt_ids == same.prompt_ids and seq.media[0].digest == same.media[0].digest
    with pytest.raises(UserError, match="fetches no media from '127.0.0.1'"):
        prepare.new_sequence(eng, ChatRequest.model_validate(chat(url)).payload())
    moved = {"type": "image_url", "image_url": {"url": f"{image_server}/moved.png"}}
    with pytest.raises(UserError, match="HTTP 302"):
        prepare.new_sequence(eng, ChatRequest.model_validate(chat(moved)).payload(), allowed)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_wav_sample_widths_and_channels_decode_to_the_same_mono_signal(width):
    rate, n = 16000, 1600
    x = np.random.RandomState(0).randint(-2000, 2000, n)
    stereo = np.repeat(x, 2)
    raw = {1: (stereo // 64 + 128).astype(np.uint8), 2: stereo.astype("<i2"), 4: (stereo * 65536).astype("<i4")}
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw[width].tobytes())
    got = decode_wav(b.getvalue(), "p", 30, rate)
    want = (x // 64) / 128 if width == 1 else x / 32768
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_resampling_keeps_a_tone_where_it_was():
    t = np.arange(44100) / 44100
    y = resample(np.sin(2 * np.pi * 440 * t), 44100, 16000)
    assert len(y) == 16000
    assert abs(np.argmax(np.abs(np.fft.rfft(y))) - 440) <= 1
