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
    # valid JSON, too deep to render: said so (it was "not JSON", the decoder's recursion limit)
    (call_history("[" * 5000 + "]" * 5000), "messages", "nest 5000 levels deep"),
    (call_history('{"a": [1, 2'), "messages", "not JSON"),
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


def test_penalties_and_logit_bias_are_taken_and_checked():
    """OpenAI's frequency / presence penalties and logit_bias, vLLM's repetition_penalty: values in range reach the
    replica's sampling fields (logit_bias as sorted (id, bias) pairs); out-of-range values and keys that are not
    plain token ids are refused naming the field (ids past the vocabulary: the engine, which knows the model)."""
    from serve_app.openai.protocol import CompletionRequest

    body = {"model": "m", "prompt": "hi", "frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.2,
            "logit_bias": {"17": -100, "3": 2.5}}
    got = dict(CompletionRequest.model_validate(body).payload().sampling)
    assert got == {"frequency_penalty": 0.5, "presence_penalty": -1.0, "repetition_penalty": 1.2,
                   "logit_bias": ((3, 2.5), (17, -100.0))}
    assert "logit_bias" not in dict(CompletionRequest.model_validate({**body, "logit_bias": {}}).payload().sampling)
    for field, value in [("frequency_penalty", 2.5), ("presence_penalty", -3), ("repetition_penalty", 0),
                         ("repetition_penalty", 1000), ("logit_bias", {"5": 101}), ("logit_bias", {"05": 1}),
                         ("logit_bias", {"-5": 1}), ("logit_bias", {"x": 1}), ("logit_bias", {"٣": 1}),
                         ("logit_bias", {"5": "1"}), ("logit_bias", {str(i): 1 for i in range(1025)}),
                         ("logit_bias", {"12345678901": 1}), ("frequency_penalty", "0.5")]:
        with pytest.raises(ValidationError) as e:
            CompletionRequest.model_validate({**body, field: value})
        assert e.value.errors()[0]["loc"][0] == field, (field, value)


def test_deep_valid_arguments_are_json_at_any_stack_depth():
    """Arguments nested within the limit are accepted however deep the caller's stack already is (the decoder's
    recursion limit counts the caller's frames: under a server's stack, valid JSON was called "not JSON")."""
    import json
    import sys

    deep = json.dumps({"a": json.loads("[" * 63 + "]" * 63)})

    def under(frames: int):
        return under(frames - 1) if frames else ChatRequest.model_validate(call_history(deep))

    under(sys.getrecursionlimit() - 80)  # the stack nearly full: the decoder's 64 levels would pass its limit
    depth, message = refusal(call_history('{"a": ' + "[" * 64 + "]" * 64 + "}"))
    assert depth == "messages" and "nest 65 levels deep (at most 64)" in message
