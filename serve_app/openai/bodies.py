"""Request bodies parsed where they cannot stall the router's event loop.

A body is JSON-decoded and validated into a request model (`protocol.ChatRequest` / `CompletionRequest`),
which also checks the schemas of `tools` / `response_format` (jsonschema) and builds and validates their
grammar (llguidance). For a large schema that is a second of CPU; on the event loop it delayed `/health`
and every other model's requests by as much. So a body that carries a schema (`"tools"` or
`"response_format"` in its bytes), or images / audio (megabytes of base64), is parsed on one of
`SCHEMA_WORKERS` threads (llguidance releases the interpreter lock; jsonschema's Python yields it every few ms),
bounded in time by `SCHEMA_TIMEOUT_S` (past it the request is a 400 naming the field; the thread finishes on its
own, and the pool's size bounds how many can run); any other body is small work and is parsed inline.

Errors are the ones FastAPI would raise (`RequestValidationError`, answered by the router's
handler), `ConstraintError` for a schema past the time bound, or `BodyError` for a body that is not
JSON at all: invalid UTF-8, nesting deeper than the decoder allows, an integer longer than Python parses.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from serve_app.openai.constraints import ConstraintError

SCHEMA_WORKERS = 2  # schema-bearing bodies parsed at once (more wait in the pool's queue)
SCHEMA_TIMEOUT_S = 10.0  # a schema that takes longer to check and compile is refused
SCHEMA_KEYS = (b'"tools"', b'"response_format"', b'"json_schema"', b'"output_config"')
# a body with images or audio: megabytes of JSON and base64 to decode (Chat, Responses, Messages part types)
MEDIA_KEYS = (b'"image_url"', b'"input_audio"', b'"input_image"', b'"image"')
_POOL = ThreadPoolExecutor(SCHEMA_WORKERS, thread_name_prefix="schema-check")


class BodyError(ValueError):
    """The body is not JSON (a 400 `invalid_json`)."""


def decode(raw: bytes):
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise BodyError("the request body is not valid UTF-8") from None
    except RecursionError:
        raise BodyError("the request body is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
        raise BodyError(f"the request body is not valid JSON: {e}") from None


def validate(model: type[BaseModel], raw: bytes) -> BaseModel:
    data = decode(raw)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None
    except RecursionError:
        raise BodyError("the request body is nested too deeply") from None


def schema_param(raw: bytes) -> str:
    if not any(k in raw for k in SCHEMA_KEYS):
        return "messages"
    return "tools" if SCHEMA_KEYS[0] in raw else "response_format"


async def parse(model: type[BaseModel], raw: bytes) -> BaseModel:
    """The request model of `raw`, validated off the event loop when it carries a schema."""
    if not any(k in raw for k in SCHEMA_KEYS + MEDIA_KEYS):
        return validate(model, raw)
    future = asyncio.get_running_loop().run_in_executor(_POOL, validate, model, raw)
    try:
        return await asyncio.wait_for(asyncio.shield(future), SCHEMA_TIMEOUT_S)
    except TimeoutError:
        what = "the media" if schema_param(raw) == "messages" else "the schema"
        raise ConstraintError(schema_param(raw), f"{what} took longer than {SCHEMA_TIMEOUT_S:.0f} s to check "
                                                 "and compile") from None


def openapi(model: type[BaseModel]) -> dict:
    """The request body's schema for `/docs` (the route reads the raw body itself)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}
