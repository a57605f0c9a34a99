"""Requests that once reached a 500 are a 400 naming their param: schemas too deep or too large to check
or compile, tool-call arguments nested past the JSON decoder's recursion, lone surrogates in tool fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serve_app.openai.constraints import ConstraintError
from serve_app.openai.protocol import ChatRequest

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def nested(levels: int) -> dict:
    schema = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def call_history(arguments: str) -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [call]},
                                       {"role": "tool", "tool_call_id": "c1", "content": "x"}]}


def refusal(body: dict) -> tuple[str | None, str]:
    """(param, message) of the request's first validation error, as the router reports it."""
    with pytest.raises(ValidationError) as e:
        ChatRequest.model_validate(body)
    err = e.value.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    return (cause.param if isinstance(cause, ConstraintError) else ".".join(map(str, err["loc"]))), err["msg"]


@pytest.mark.parametrize("body,param,words", [
    ({**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": nested(300)}}},
     "response_format", "too large"),
    ({**BASE, "tools": [{"type": "function", "function": {"name": "f", "parameters": nested(300)}}]},
     "tools", "too large"),
    ({**BASE, "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}}}]},
     "tools", "too large"),
    (call_history("[" * 5000 + "]" * 5000), "messages", "not JSON"),
    (call_history('{"a": "\\ud800"}'), "messages", "surrogate"),
])
def test_refused_with_the_param(body, param, words):
    got_param, message = refusal(body)
    assert got_param == param and words in message, (got_param, message)


def test_lone_surrogates_in_tool_fields_are_refused():
    tool = {"type": "function", "function": {"name": "f", "description": "\ud800"}}
    assert refusal({**BASE, "tools": [tool]})[0] == "tools.0.function.description"
    msg = {"role": "tool", "tool_call_id": "\ud800", "content": "x"}
    assert refusal({"model": "m", "messages": [msg]})[0] == "messages.0.tool_call_id"


@pytest.mark.parametrize("raw,words", [(b'{"model": "m", "prompt": "\xff\xfe"}', "UTF-8"),
                                       (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
                                       (b'{"model": "m", "prompt": "x", "seed": ' + b"9" * 5000 + b"}", "digits"),
                                       (b'{"model": ', "not valid JSON")])
def test_bodies_that_are_not_json_are_body_errors(raw, words):
    """The router answers these with 400 `invalid_json` (they had `code: null`)."""
    import asyncio

    from serve_app.openai import bodies
    from serve_app.openai.protocol import CompletionRequest

    with pytest.raises(bodies.BodyError, match=words):
        asyncio.run(bodies.parse(CompletionRequest, raw))
