"""What the Responses and Anthropic Messages adapters share: a body of another API becomes a chat request
(`protocol.ChatRequest`, so the same validation, grammar, sampling fields and `events.GenerateRequest`), and any
error that request raises is reported under the other API's field names (a 400 naming `input`, not `messages`).
Pure Python."""

from __future__ import annotations

import re

from pydantic import ValidationError

from serve_app.openai.constraints import ConstraintError
from serve_app.openai.media_parts import image_part
from serve_app.openai.protocol import ChatRequest, UnsupportedField


def need(ok, param: str, message: str) -> None:
    """A 400 naming `param` unless `ok`."""
    if not ok:
        raise ConstraintError(param, f"{param}: {message}" if not message.startswith(param) else message)


def of_type(value, types, param: str, what: str):
    need(isinstance(value, types) and not (isinstance(value, bool) and bool not in _tuple(types)), param,
         f"must be {what}")
    return value


def _tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def text_of(content, param: str, kinds: tuple[str, ...]) -> str:
    """A content field as text: a string, or a list of text parts (`{"type": <one of kinds>, "text": ...}`)."""
    if isinstance(content, str):
        return content
    need(isinstance(content, list), param, "must be a string or a list of text parts")
    out = []
    for j, part in enumerate(content):
        need(isinstance(part, dict), f"{param}[{j}]", "must be an object")
        need(part.get("type") in kinds, f"{param}[{j}].type",
             f"only text parts are supported ({', '.join(kinds)}), got {str(part.get('type'))[:40]!r}")
        out.append(of_type(part.get("text"), str, f"{param}[{j}].text", "a string"))
    return "".join(out)


def content_of(content, param: str, kinds: tuple[str, ...], media: dict) -> str | list[dict]:
    """A content field as chat content: a string, or, when it holds media parts (`media`: part type -> function
    (part, param) -> the chat part), a list of chat parts (text, image_url, input_audio) in order."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and _kind(p) in media for p in content):
        return text_of(content, param, kinds)
    out = []
    for j, part in enumerate(content):
        at = f"{param}[{j}]"
        need(isinstance(part, dict), at, "must be an object")
        if _kind(part) in media:
            out.append(media[part["type"]](part, at))
        else:
            need(part.get("type") in kinds, f"{at}.type", f"content parts of type {str(part.get('type'))[:40]!r} are "
                                                          f"not supported ({', '.join(kinds + tuple(media))})")
            out.append({"type": "text", "text": of_type(part.get("text"), str, f"{at}.text", "a string")})
    return out


def _kind(part: dict) -> str | None:
    return part["type"] if isinstance(part.get("type"), str) else None


def image_url_part(url, param: str) -> dict:
    """A chat `image_url` part for `url` (a data: or http(s) URL), checked here so a 400 names this API's field."""
    image_part(of_type(url, str, param, "a string (a data: URL or an http(s) URL)"), param)
    return {"type": "image_url", "image_url": {"url": url}}


def chat_request(chat: dict, names: dict[str, str]) -> ChatRequest:
    """`chat` (a chat completion body) validated; an error names the field of the other API (`names`: chat field
    -> that API's field)."""
    try:
        return ChatRequest.model_validate(chat)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, ConstraintError):
            raise _renamed(cause.param, str(cause), names) from None
        if isinstance(cause, UnsupportedField):
            raise _renamed(cause.name, str(cause), names) from None
        loc = [str(x) for x in err.get("loc", ()) if not isinstance(x, int) and x not in _BRANCHES]
        param = loc[0] if loc else "body"
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        raise _renamed(param, f"{'.'.join(loc) or param}: {msg}", names) from None


_BRANCHES = {"str", "int", "float", "bool", "TextPart", "list[TextPart]", "list[tagged-union[TextPart,ImageURLPart,"
             "InputAudioPart]]", "text", "image_url", "input_audio", "NamedToolChoice", "literal['none','auto',"
             "'required']"}


def _renamed(param: str, message: str, names: dict[str, str]) -> ConstraintError:
    for chat_name, name in names.items():
        message = re.sub(rf"\b{re.escape(chat_name)}\b", name, message)
    param = names.get(param, param)
    return ConstraintError(param, message if param in message else f"{param}: {message}")
