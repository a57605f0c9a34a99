"""The Responses and Anthropic Messages adapters without a server: bodies become the chat request they stand for
(one protocol layer: the same GenerateRequest, grammar and parser), their answers and stream events validate
against the official SDKs' own types, errors name each API's field; `n` on chat and completions; the API key in
`x-api-key`; and issue 45's protocol items (each of these failed before its fix)."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from serve_app.events import Delta, Finished, Started
from serve_app.openai import anthropic_api as AA
from serve_app.openai import protocol as P
from serve_app.openai import responses_api as RA
from serve_app.openai.constraints import ConstraintError
from serve_app.ops import gate

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
THOUGHT_CALL = '<|channel>thought\nhmm<channel|>ok <|tool_call>call:f{a:1}<tool_call|>'


def sse_events(lines: list[str]) -> list[tuple[str, dict]]:
    out = []
    for line in lines:
        head, data = line.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: ") and line.endswith("\n\n")
        out.append((head[7:], json.loads(data[6:])))
    return out


def stream(writer, text: str, finish: str = "stop", cut: int = 7) -> list[str]:
    return (writer.head([Started(12, False)]) + writer.delta(0, Delta(text[:cut], ())) +
            writer.finish(0, Finished(finish, 12, 9, text[cut:])))


# --- Responses ----------------------------------------------------------------------------------------------------

RESP = {"model": "m", "instructions": "sys", "max_output_tokens": 50, "reasoning": {"effort": "medium"},
        "tools": [{"type": "function", "name": "f", "parameters": SCHEMA}],
        "tool_choice": {"type": "function", "name": "f"},
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                                  "text": "think"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 2}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "4"}]}


def test_responses_body_is_a_chat_request():
    body = RA.ResponsesBody.model_validate(RESP)
    chat = P.ChatRequest.model_validate({
        "model": "m", "max_completion_tokens": 50, "chat_template_kwargs": {"enable_thinking": True},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "reasoning_content": "think", "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 2}'}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "4"}]})
    assert body.payloads() == [chat.payload()] and body.payloads()[0].grammar is not None


def test_responses_result_and_stream_are_the_sdk_types():
    from openai.types.responses import Response, ResponseStreamEvent

    body = RA.ResponsesBody.model_validate(RESP)
    whole = Response.model_validate(RA.ResponsesWriter(body).result([Finished("stop", 12, 9, THOUGHT_CALL)]))
    assert [o.type for o in whole.output] == ["reasoning", "message", "function_call"]
    assert whole.output[0].content[0].text == "hmm" and whole.output_text == "ok"
    assert json.loads(whole.output[2].arguments) == {"a": 1} and whole.usage.total_tokens == 21
    events = sse_events(stream(RA.ResponsesWriter(body), THOUGHT_CALL))
    adapter = TypeAdapter(ResponseStreamEvent)
    for name, data in events:
        assert adapter.validate_python(data).type == name
    kinds = [n for n, _ in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and [d["sequence_number"] for _, d in events] == list(range(len(kinds)))
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    final = Response.model_validate(events[-1][1]["response"])
    assert [o.type for o in final.output] == [o.type for o in whole.output]


def test_responses_length_is_incomplete():
    body = RA.ResponsesBody.model_validate({"model": "m", "input": "x"})
    r = RA.ResponsesWriter(body).result([Finished("length", 3, 5, "abc")])
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}


def test_messages_stop_sequence_is_reported():
    """A stop string that ended the output is `stop_reason: "stop_sequence"` with the string, whole and streamed;
    the engine says which one matched (the first in the text)."""
    from neuron_workers.engine.stops import StopStrings

    stops = StopStrings(["END", "NE"])
    assert stops.feed("the ") == "the " and stops.feed("ENDING") == "" and stops.matched == "END"
    body = AA.MessagesBody.model_validate({"model": "m", "max_tokens": 5, "stop_sequences": ["END"],
                                           "messages": [{"role": "user", "content": "x"}]})
    whole = AA.MessagesWriter(body).result([Finished("stop", 1, 5, "abc", stop_sequence="END")])
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", "END")
    w = AA.MessagesWriter(body)
    events = sse_events(w.head([Started(1, False)]) + w.finish(0, Finished("stop", 1, 5, "abc", stop_sequence="END")))
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


@pytest.mark.parametrize("extra,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": [{"type": "input_image"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].image_url"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
     "tool_choice"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "x": 1}]},
     "input[1].content"),
])
def test_responses_errors_name_the_field(extra, param):
    with pytest.raises(ConstraintError) as e:
        RA.ResponsesBody.model_validate({"model": "m", "input": "x", **extra})
    assert e.value.param == param and param in str(e.value), str(e.value)


# --- Anthropic ----------------------------------------------------------------------------------------------------

MSGS = {"model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "sys"}], "stop_sequences": ["END"],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [{"name": "f", "input_schema": SCHEMA}], "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "think", "signature": ""},
                                                       {"type": "tool_use", "id": "t1", "name": "f",
                                                        "input": {"a": 2}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"},
                                                  {"type": "text", "text": "and?"}]}]}


def test_messages_body_is_a_chat_request():
    body = AA.MessagesBody.model_validate(MSGS)
    chat = P.ChatRequest.model_validate({
        "model": "m", "max_completion_tokens": 50, "stop": ["END"], "chat_template_kwargs": {"enable_thinking": True},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}], "tool_choice": "required",
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "reasoning_content": "think", "tool_calls": [
                         {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 2}'}}]},
                     {"role": "tool", "tool_call_id": "t1", "content": "4"}, {"role": "user", "content": "and?"}]})
    assert body.payloads() == [chat.payload()]


def test_messages_result_and_stream_are_the_sdk_types():
    from anthropic.types import Message, RawMessageStreamEvent

    body = AA.MessagesBody.model_validate(MSGS)
    whole = Message.model_validate(AA.MessagesWriter(body).result([Finished("stop", 12, 9, THOUGHT_CALL)]))
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"] and whole.stop_reason == "tool_use"
    assert whole.content[2].input == {"a": 1} and whole.usage.output_tokens == 9
    events = sse_events(stream(AA.MessagesWriter(body), THOUGHT_CALL))
    adapter = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        assert adapter.validate_python(data).type == name
    kinds = [n for n, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    deltas = {d["delta"]["type"] for n, d in events if n == "content_block_delta"}
    assert {"thinking_delta", "text_delta", "input_json_delta"} <= deltas
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("reason,want", [("stop", "end_turn"), ("length", "max_tokens")])
def test_messages_stop_reasons(reason, want):
    body = AA.MessagesBody.model_validate({"model": "m", "max_tokens": 5, "messages": [{"role": "user",
                                                                                         "content": "x"}]})
    assert AA.MessagesWriter(body).result([Finished(reason, 1, 5, "abc")])["stop_reason"] == want


@pytest.mark.parametrize("extra,param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages[0].content[0].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "tool"}, "tools": [{"name": "f", "input_schema": SCHEMA}]}, "tool_choice.name"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"thinking": {"type": "on"}}, "thinking.type"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
])
def test_messages_errors_name_the_field(extra, param):
    with pytest.raises(ConstraintError) as e:
        AA.MessagesBody.model_validate({"model": "m", "max_tokens": 5,
                                        "messages": [{"role": "user", "content": "x"}], **extra})
    assert e.value.param == param and param in str(e.value), str(e.value)


def test_count_tokens_needs_no_max_tokens():
    body = AA.CountTokensBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert body.chat.payload().messages == ({"role": "user", "content": "x"},)


def test_anthropic_error_shape():
    from serve_app.http import as_anthropic, error

    out = as_anthropic(error(400, "must be positive", param="max_tokens"))
    assert out.status_code == 400 and json.loads(out.body) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: must be positive"}}
    assert json.loads(as_anthropic(error(503, "busy", "server_error")).body)["error"]["type"] == "overloaded_error"


# --- the API key ----------------------------------------------------------------------------------------------------

def test_x_api_key_is_the_api_key(monkeypatch):
    monkeypatch.setattr(gate.SETTINGS, "key_digests", [gate.key_digest("s3cret")])
    assert gate.authorized({b"x-api-key": b"s3cret"}) and gate.authorized({b"authorization": b"Bearer s3cret"})
    assert not gate.authorized({b"x-api-key": b"wrong"}) and not gate.authorized({})
    body = json.loads(gate._envelope(401, "no key", "invalid_api_key", path="/app/v1/messages")["body"])
    assert body == {"type": "error", "error": {"type": "authentication_error", "message": "no key"}}
    assert "error" in json.loads(gate._envelope(401, "no key", "invalid_api_key", path="/v1/chat/completions")["body"])


# --- n > 1 ----------------------------------------------------------------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def test_n_choices_are_seeded_one_apart():
    seeds = [dict(p.sampling).get("seed") for p in P.ChatRequest.model_validate({**CHAT, "n": 3, "seed": 5})
             .payloads()]
    assert seeds == [5, 6, 7]
    top = P.SEED_RANGE[1]
    seeds = [dict(p.sampling)["seed"] for p in P.CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "n": 2, "seed": top}).payloads()]
    assert seeds == [top, P.SEED_RANGE[0]]  # kept in the generator's range
    assert [dict(p.sampling).get("seed") for p in P.ChatRequest.model_validate({**CHAT, "n": 2}).payloads()] == [
        None, None]


@pytest.mark.parametrize("extra,param", [({"n": 9}, "n"), ({"n": 0}, "n"), ({"n": 8, "max_tokens": 5000}, "n")])
def test_n_limits(extra, param):
    with pytest.raises(ValidationError) as e:
        P.ChatRequest.model_validate({**CHAT, **extra})
    err = e.value.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    assert (cause.param if isinstance(cause, ConstraintError) else err["loc"][0]) == param


# --- issue 45's protocol items --------------------------------------------------------------------------------------

def test_n_null_is_accepted():
    assert len(P.ChatRequest.model_validate({**CHAT, "n": None}).payloads()) == 1
    assert len(P.CompletionRequest.model_validate({"model": "m", "prompt": "x", "n": None}).payloads()) == 1


def test_stream_options_needs_stream():
    with pytest.raises(ValidationError) as e:
        P.ChatRequest.model_validate({**CHAT, "stream_options": {"include_usage": True}})
    assert e.value.errors()[0]["ctx"]["error"].param == "stream_options"
    P.ChatRequest.model_validate({**CHAT, "stream": True, "stream_options": {"include_usage": True}})


def test_tool_choice_without_a_function_names_the_object_form():
    with pytest.raises(ValidationError) as e:
        P.ChatRequest.model_validate({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
                                      "tool_choice": {"type": "function"}})
    cause = e.value.errors()[0]["ctx"]["error"]
    assert cause.param == "tool_choice" and '{"type": "function", "function": {"name": "..."}}' in str(cause)


def test_messages_length_error_reads_as_english():
    from neuron_workers.errors import ContextLengthError
    from serve_app.replica.prepare import check_text_length

    class Engine:
        max_context, max_token_chars = 1000, 1

    with pytest.raises(ContextLengthError) as e:
        check_text_length(Engine(), 102_000, "messages")
    assert "the messages have 102000 characters" in str(e.value)
    with pytest.raises(ContextLengthError) as e:
        check_text_length(Engine(), 5000, "prompt")
    assert "the prompt has 5000 characters" in str(e.value)


# --- no body reaches a 500 ------------------------------------------------------------------------------------------

ODD = [None, 0, -1, 1.5, True, "", "x", [], [None], {}, {"type": None}, [{"type": "text"}], {"a": [1]}, "\ud800"]


def _paths(x, at=()):
    yield at
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        yield from _paths(v, at + (k,))


@pytest.mark.parametrize("base,cls", [(RESP, RA.ResponsesBody), (MSGS, AA.MessagesBody)])
def test_mangled_bodies_are_400s(base, cls):
    """Two fields of a valid body set to odd values, 1,500 times (seeded): each is accepted or a ConstraintError
    (a 400 naming a field), never another exception (a 500)."""
    import copy
    import random

    rng, paths = random.Random(0), [p for p in _paths(base) if p]
    for _ in range(1500):
        body = copy.deepcopy(base)
        for at in rng.sample(paths, 2):
            try:
                parent = body
                for k in at[:-1]:
                    parent = parent[k]
                parent[at[-1]] = copy.deepcopy(rng.choice(ODD))
            except (KeyError, IndexError, TypeError):
                pass
        try:
            cls.model_validate(body).payloads()
        except ConstraintError as e:
            assert e.param and str(e)


def test_a_template_recursion_is_the_requests_400():
    from neuron_workers.errors import UserError
    from serve_app.replica.render import render

    class Engine:
        def render_chat(self, messages, tools, **kw):
            raise RecursionError("maximum recursion depth exceeded")

    with pytest.raises(UserError) as e:
        render(Engine(), [{"role": "user", "content": "x"}], None)
    assert e.value.param == "messages" and "nested too deeply" in str(e.value)


def test_a_replica_refusal_names_the_apis_field():
    from serve_app.events import Failed
    from serve_app.http import failed

    ev = Failed(400, "this model's context is 64 tokens; the prompt has 70 and max_tokens asks 8 more",
                "context_length_exceeded", param="prompt")
    chat = json.loads(failed(ev, True).body)["error"]
    assert chat["param"] == "messages" and "the messages have 70 and" in chat["message"]
    resp = json.loads(failed(ev, True, "input").body)["error"]
    assert resp["param"] == "input" and "the input has 70 and" in resp["message"]
    done = json.loads(failed(ev, False).body)["error"]
    assert done["param"] == "prompt" and done["message"] == ev.message
