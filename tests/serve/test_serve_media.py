"""Images and audio over HTTP on a real Ray Serve app serving the three tiny models as configs/local.yaml does:
every model answers a chat with an image part and an audio part (200), `usage.prompt_tokens` counts the soft tokens
(as `/tokenize` does), two different images give different greedy answers and the same image the same one; the
Responses API's `input_image`, Anthropic's `image` block and the openai SDK; bad media are 400s naming the part, and
the model carries on."""

from __future__ import annotations

import base64
import io
import wave

import httpx
import numpy as np
import pytest
from PIL import Image

from conftest import deploy

pytestmark = pytest.mark.slow
MODELS = {"e2b": "gemma4-e2b-tiny", "e4b": "gemma4-e4b-tiny", "12b": "gemma4-12b-tiny"}


def png(seed: int, size=(32, 24)) -> str:
    arr = np.random.RandomState(seed).randint(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).save(b, "PNG")
    return base64.b64encode(b.getvalue()).decode()


def wav(seconds: float, rate: int = 16000) -> str:
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.random.RandomState(0).randint(-3000, 3000, int(seconds * rate)).astype("<i2").tobytes())
    return base64.b64encode(b.getvalue()).decode()


def image_part(b64: str, mime: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64}"}}


def audio_part(b64: str) -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}


def chat(model: str, *parts, max_tokens: int = 6) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                                       *parts]}],
            "max_tokens": max_tokens, "temperature": 0}


@pytest.fixture(scope="module")
def app(serve_url, tiny_dirs):
    models = [{"name": name, "path": str(tiny_dirs[d]), "backend": "cpu", "max_context": 512, "max_batch": 4}
              for name, d in MODELS.items()]
    url = deploy({"models": models, "accelerator_resource": "", "graceful_shutdown_wait_loop_s": 0}, "media",
                 serve_url)
    yield url
    from ray import serve

    serve.delete("media")


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=300)


@pytest.mark.parametrize("model", list(MODELS))
def test_every_model_takes_an_image_and_audio_and_counts_their_tokens(app, model):
    body = chat(model, image_part(png(1)), audio_part(wav(0.5)))
    r = post(app, "/chat/completions", body)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    tok = post(app.removesuffix("/v1"), "/tokenize", {"model": model, "messages": body["messages"]}).json()
    text_only = post(app.removesuffix("/v1"), "/tokenize", {"model": model, "messages": [
        {"role": "user", "content": "What is this?"}]}).json()
    assert usage["prompt_tokens"] == tok["count"] > text_only["count"] + 4
    assert usage["completion_tokens"] == 6


def test_different_images_different_answers_same_image_same_answer(app):
    answers = [post(app, "/chat/completions", chat("e2b", image_part(png(s)), max_tokens=8)).json()
               for s in (1, 2, 1)]
    texts = [a["choices"][0]["message"]["content"] for a in answers]
    assert texts[0] == texts[2] and texts[0] != texts[1]


def test_responses_input_image_and_anthropic_image_block(app):
    from anthropic import Anthropic
    from openai import OpenAI

    oa = OpenAI(base_url=app, api_key="none", max_retries=0, timeout=120)
    r = oa.responses.create(model="e4b", max_output_tokens=5, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Describe:"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{png(3)}"}]}])
    assert r.output_text and r.usage.input_tokens > 20
    c = oa.chat.completions.create(model="12b", max_tokens=5, temperature=0,
                                   messages=[{"role": "user", "content": [image_part(png(3))]}])
    assert c.choices[0].message.content is not None and c.usage.prompt_tokens > 10
    an = Anthropic(base_url=app.removesuffix("/v1"), api_key="none", max_retries=0, timeout=120)
    m = an.messages.create(model="e2b", max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(3)}},
        {"type": "text", "text": "What is it?"}]}])
    assert m.content and m.usage.input_tokens > 20


@pytest.mark.parametrize("part,param", [
    (image_part(png(1)[:120]), "messages.0.content.1.image_url"),  # a truncated PNG
    (image_part(base64.b64encode(b"plain text").decode(), "text/plain"), "messages.0.content.1.image_url"),
    (audio_part(wav(600, rate=8000)), "messages.0.content.1.input_audio"),  # 10 minutes
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "messages.0.content.1.image_url"),
], ids=["truncated png", "not an image", "10 minutes of audio", "host not allowed"])
def test_bad_media_are_400s_naming_the_part(app, part, param):
    r = post(app, "/chat/completions", chat("e2b", part))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert post(app, "/chat/completions", chat("e2b", image_part(png(1)))).status_code == 200
