"""Image and audio parts at the HTTP boundary (no model): chat's `image_url` / `input_audio` parts become
`MediaPart`s in prompt order with the template's placeholders in the messages; the Responses and Anthropic shapes
map onto them; malformed parts, too many or too large items are 400s naming the part, in each API's own field
names; the error handler reports an unknown part type as such."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from fastapi.exceptions import RequestValidationError

from serve_app import http
from serve_app.events import MAX_MEDIA_BYTES
from serve_app.openai import anthropic_api as AA
from serve_app.openai import bodies
from serve_app.openai import responses_api as RA
from serve_app.openai.constraints import ConstraintError
from serve_app.openai.media_parts import MAX_MEDIA_ITEMS
from serve_app.openai.protocol import ChatRequest

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR42mO8o6HBwMDAxMDAwMDAAAAO7gEwnuiAAQA"
                       "AAABJRU5ErkJggg==")  # a 2 x 2 PNG
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}}
AUDIO = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF0000WAVE").decode(), "format": "wav"}}


def chat(*messages) -> dict:
    return {"model": "m", "messages": list(messages)}


def user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def test_parts_become_media_in_prompt_order_and_placeholders_in_the_messages():
    req = ChatRequest.model_validate(chat({"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                                          user({"type": "text", "text": "Compare "}, IMAGE, AUDIO),
                                          {"role": "assistant", "content": "ok"}, user(IMAGE)))
    p = req.payload()
    assert p.messages[0]["content"] == "Be brief."  # text-only lists stay text
    assert p.messages[1]["content"] == [{"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "audio"}]
    assert [(m.kind, m.param) for m in p.media] == [("image", "messages.1.content.1.image_url"),
                                                     ("audio", "messages.1.content.2.input_audio"),
                                                     ("image", "messages.3.content.0.image_url")]
    assert p.media[0].data == PNG and p.media[0].format == "png" and p.media[1].format == "wav"
    assert ChatRequest.model_validate(chat(user({"type": "text", "text": "hi"}))).payload().media == ()


def refusal(body: dict) -> tuple[str, str]:
    """(param, message) as the router answers a body (the error handler's choice among pydantic's errors)."""
    try:
        bodies.validate(ChatRequest, json.dumps(body).encode())
    except (RequestValidationError, ConstraintError) as e:
        handler = http._validation if isinstance(e, RequestValidationError) else http._constraint
        err = json.loads(asyncio.run(handler(None, e)).body)["error"]
        return err["param"], err["message"]
    raise AssertionError("accepted")


def image_url(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.parametrize("part,param,words", [
    (image_url("data:text/plain;base64,aGVsbG8="), "messages.0.content.0.image_url", "not an image"),
    (image_url("data:image/png;base64,@@@@"), "messages.0.content.0.image_url", "not valid base64"),
    (image_url("data:image/png,rawbytes"), "messages.0.content.0.image_url", "must be base64"),
    (image_url("file:///etc/passwd"), "messages.0.content.0.image_url", "data: URL"),
    ({"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "mp3"}},
     "messages.0.content.0.input_audio.format", "mp3"),
    ({"type": "video_url", "video_url": {"url": "x"}}, "messages", "video_url"),
    ({"type": "image_url"}, "messages", "image_url"),
])
def test_malformed_parts_are_400s_naming_the_part(part, param, words):
    got, message = refusal(chat(user(part)))
    assert got == param and words in message


def test_limits_items_bytes_and_roles():
    many = chat(user(*[IMAGE] * (MAX_MEDIA_ITEMS + 1)))
    assert refusal(many) == ("messages", f"a request takes at most {MAX_MEDIA_ITEMS} images and audio clips, got "
                                         f"{MAX_MEDIA_ITEMS + 1}")
    big = image_url("data:image/png;base64," + base64.b64encode(b"\0" * (MAX_MEDIA_BYTES + 1)).decode())
    param, message = refusal(chat(user(big)))
    assert param == "messages.0.content.0.image_url" and "larger than 20 MiB" in message
    param, message = refusal(chat(user({"type": "text", "text": "hi"}), {"role": "assistant", "content": [IMAGE]}))
    assert param == "messages.1.content.0" and "not in the assistant message" in message
    param, message = refusal(chat({"role": "system", "content": [IMAGE]}, user({"type": "text", "text": "hi"})))
    assert param == "messages.0.content.0" and "user or tool messages" in message


def test_responses_input_image_and_audio_map_to_chat_parts():
    body = RA.ResponsesBody.model_validate({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is "},
                                     {"type": "input_image", "image_url": IMAGE["image_url"]["url"]}, AUDIO]}]})
    p = body.payloads()[0]
    assert p.messages[1]["content"] == [{"type": "text", "text": "What is "}, {"type": "image"}, {"type": "audio"}]
    assert [m.kind for m in p.media] == ["image", "audio"]
    with pytest.raises(ConstraintError) as e:
        RA.ResponsesBody.model_validate({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:text/html;base64,PGI+"}]}]})
    assert e.value.param == "input[0].content[0].image_url"
    with pytest.raises(ConstraintError) as e:
        RA.ResponsesBody.model_validate({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-1"}]}]})
    assert e.value.param == "input[0].content[0].file_id"


def test_anthropic_image_blocks_map_to_chat_parts():
    data = base64.b64encode(PNG).decode()
    body = AA.MessagesBody.model_validate({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": "and"},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/b.png"}}]}]})
    p = body.payloads()[0]
    assert p.messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]
    assert p.media[0].data == PNG and p.media[1].url == "https://example.com/b.png"
    with pytest.raises(ConstraintError) as e:
        AA.MessagesBody.model_validate({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!"}}]}]})
    assert e.value.param == "messages[0].content[0].source"
