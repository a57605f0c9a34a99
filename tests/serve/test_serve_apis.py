"""The Responses API, Anthropic's Messages API and `n` > 1, served by a real Ray Serve app (tiny E2B checkpoint on
the CPU backend) and driven by the official `openai` and `anthropic` clients: text, forced function calls / tool_use
(valid against the tool's schema by construction), streams, count_tokens, chat and completions with n=2 (seeded
choices reproducible), every bad field a 400 in its API's shape naming it; and issue 45's protocol items."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from conftest import deploy

pytestmark = pytest.mark.slow
CTX = 1024
KEY = "s3cret-key"  # the openai client sends it as `Authorization: Bearer`, the anthropic client as `x-api-key`
BEARER = {"Authorization": f"Bearer {KEY}"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}


@pytest.fixture(scope="module")
def app(serve_url, tiny_dirs):
    models = [{"name": "e2b", "path": str(tiny_dirs["gemma4-e2b-tiny"]), "backend": "cpu", "max_context": CTX,
               "max_batch": 4, "max_ongoing_requests": 8}]
    url = deploy({"models": models, "accelerator_resource": "", "graceful_shutdown_wait_loop_s": 0,
                  "api_keys": [KEY]}, "apis", serve_url)
    yield url
    from ray import serve

    serve.delete("apis")


def openai_client(url):
    from openai import OpenAI

    return OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)


def anthropic_client(url, key: str = KEY):
    from anthropic import Anthropic

    return Anthropic(base_url=url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=120)


# --- Responses API ------------------------------------------------------------------------------------------------

def test_responses_text_and_usage(app):
    r = openai_client(app).responses.create(model="e2b", input="Say hi", instructions="Be brief.",
                                            max_output_tokens=8, temperature=0.0)
    assert r.status in ("completed", "incomplete") and r.object == "response"
    assert r.output and r.output[0].type == "message" and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_responses_forced_function_call(app):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}]
    c = openai_client(app)
    for seed in (0, 1):
        r = c.responses.create(model="e2b", input=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
                               tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=150,
                               temperature=1.0, extra_body={"seed": seed})
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    # the tool loop's next step: the call and its output as input items
    r2 = c.responses.create(model="e2b", tools=tools, max_output_tokens=8, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
    assert r2.status in ("completed", "incomplete") and r2.usage.input_tokens > r.usage.input_tokens


def test_responses_stream(app):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    stream = openai_client(app).responses.create(model="e2b", input="Weather?", tools=tools, tool_choice="required",
                                                 max_output_tokens=150, temperature=1.0, stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for k in ("response.output_item.added", "response.function_call_arguments.delta",
              "response.function_call_arguments.done", "response.output_item.done"):
        assert k in kinds, kinds
    args: dict[str, str] = {}
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            args[e.item_id] = args.get(e.item_id, "") + e.delta
    final = events[-1].response
    calls = [o for o in final.output if o.type == "function_call"]
    assert len(calls) == len(args) >= 1 and final.usage.output_tokens > 0
    for call in calls:
        assert call.arguments == args[call.id]
        jsonschema.validate(json.loads(call.arguments), WEATHER)
    with openai_client(app).responses.stream(model="e2b", input="Weather?", tools=tools, tool_choice="required",
                                             max_output_tokens=150, temperature=1.0, parallel_tool_calls=False) as s:
        helper = [e.type for e in s]  # the SDK's own accumulator checks the order and identity of every event
        final = s.get_final_response()
    assert helper[-1] == "response.completed" and final.output[-1].type == "function_call"
    jsonschema.validate(json.loads(final.output[-1].arguments), WEATHER)
    text = openai_client(app).responses.create(model="e2b", input="Hi", max_output_tokens=6, stream=True)
    kinds = [e.type for e in text]
    assert "response.output_text.delta" in kinds and "response.content_part.added" in kinds
    assert "response.output_text.done" in kinds and kinds[-1] in ("response.completed", "response.incomplete")


def test_responses_json_schema(app):
    r = openai_client(app).responses.create(model="e2b", input="A city", max_output_tokens=100, temperature=1.0,
                                            text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER}})
    jsonschema.validate(json.loads(r.output_text), WEATHER)


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": 3}, "input"),
    ({"input": [{"type": "input_image"}]}, "input[0].type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"},
      "tools": [{"type": "function", "name": "f"}]}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"input": "x " * 51_000}, "input"),  # refused by the replica (context length), named in this API's terms
])
def test_responses_errors(app, body, param):
    r = httpx.post(f"{app}/responses", json={"model": "e2b", **body}, timeout=60, headers=BEARER)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err


# --- Anthropic Messages API ---------------------------------------------------------------------------------------

def test_messages_text(app):
    m = anthropic_client(app).messages.create(model="e2b", max_tokens=8, system="Be brief.",
                                              messages=[{"role": "user", "content": "Say hi"}],
                                              extra_body={"temperature": 0.0})
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8 and m.usage.input_tokens


def test_messages_forced_tool_use_and_result(app):
    c = anthropic_client(app)
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
    m = c.messages.create(model="e2b", max_tokens=150, extra_body={"temperature": 1.0}, tools=tools,
                          tool_choice={"type": "tool", "name": "get_weather"},
                          messages=[{"role": "user", "content": "Weather in Paris?"}])
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) >= 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER)
    m2 = c.messages.create(model="e2b", max_tokens=8, tools=tools, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                           "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]}])
    assert m2.usage.input_tokens > m.usage.input_tokens


def test_messages_stream(app):
    c = anthropic_client(app)
    tools = [{"name": "get_weather", "input_schema": WEATHER}]
    with c.messages.stream(model="e2b", max_tokens=150, extra_body={"temperature": 1.0}, tools=tools,
                           tool_choice={"type": "any", "disable_parallel_tool_use": True},
                           messages=[{"role": "user", "content": "Weather?"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert final.stop_reason == "tool_use"
    jsonschema.validate(next(b for b in final.content if b.type == "tool_use").input, WEATHER)
    with c.messages.stream(model="e2b", max_tokens=6, messages=[{"role": "user", "content": "Hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.content[0].text == text and final.usage.output_tokens > 0


def test_messages_structured_output(app):
    m = anthropic_client(app).messages.create(model="e2b", max_tokens=100, extra_body={"temperature": 1.0},
                                              messages=[{"role": "user", "content": "A city"}],
                                              output_config={"format": {"type": "json_schema", "schema": WEATHER}})
    jsonschema.validate(json.loads(m.content[0].text), WEATHER)


def test_messages_count_tokens(app):
    c = anthropic_client(app)
    msgs = [{"role": "user", "content": "Say hi"}]
    n = c.messages.count_tokens(model="e2b", messages=msgs).input_tokens
    m = c.messages.create(model="e2b", max_tokens=2, messages=msgs)
    assert n == m.usage.input_tokens > 0


@pytest.mark.parametrize("body,words", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0].content[0]"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["a"] * 5},
     "stop_sequences"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}},
     "tool_choice"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "maybe"}},
     "thinking.type"),
])
def test_messages_errors_in_anthropic_shape(app, body, words):
    r = httpx.post(f"{app}/messages", json={"model": "e2b", **body}, timeout=60, headers=BEARER)
    assert r.status_code == 400, r.text
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error" and words in j["error"]["message"]


def test_messages_sdk_errors(app):
    import anthropic

    c = anthropic_client(app)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="e2b", max_tokens=5, messages=[{"role": "user", "content": "x" * 100_000}])
    assert "messages" in e.value.body["error"]["message"]
    r = httpx.post(f"{app}/messages", content=b"{not json", timeout=30, headers={"x-api-key": KEY})
    assert r.status_code == 400 and r.json()["type"] == "error"
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic_client(app, "wrong").messages.create(model="e2b", max_tokens=5,
                                                       messages=[{"role": "user", "content": "x"}])
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": e.value.body[
        "error"]["message"]}} and "x-api-key" in e.value.body["error"]["message"]


# --- n > 1 --------------------------------------------------------------------------------------------------------

def test_chat_n2_seeded_and_streamed(app):
    c = openai_client(app)
    msgs = [{"role": "user", "content": "Tell me a story"}]
    two = c.chat.completions.create(model="e2b", messages=msgs, n=2, max_tokens=12, temperature=1.0, seed=7)
    assert [ch.index for ch in two.choices] == [0, 1]
    one = [c.chat.completions.create(model="e2b", messages=msgs, max_tokens=12, temperature=1.0, seed=s)
           for s in (7, 8)]
    assert [ch.message.content for ch in two.choices] == [o.choices[0].message.content for o in one]
    assert two.usage.completion_tokens == sum(o.usage.completion_tokens for o in one)
    assert two.usage.prompt_tokens == one[0].usage.prompt_tokens
    stream = c.chat.completions.create(model="e2b", messages=msgs, n=2, max_tokens=12, temperature=1.0, seed=7,
                                       stream=True, stream_options={"include_usage": True})
    text, finish, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        for ch in chunk.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
        usage = chunk.usage or usage
    assert [text[0], text[1]] == [ch.message.content for ch in two.choices] and set(finish) == {0, 1}
    assert usage.completion_tokens == two.usage.completion_tokens


def test_completions_n2(app):
    c = openai_client(app)
    r = c.completions.create(model="e2b", prompt="Once upon", n=2, max_tokens=6, temperature=1.0, seed=3)
    alone = c.completions.create(model="e2b", prompt="Once upon", max_tokens=6, temperature=1.0, seed=4)
    assert [ch.index for ch in r.choices] == [0, 1] and r.choices[1].text == alone.choices[0].text
    chunks = list(c.completions.create(model="e2b", prompt="Once upon", n=2, max_tokens=6, temperature=1.0, seed=3,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices[0].index == 1) == alone.choices[0].text


@pytest.mark.parametrize("body,param", [
    ({"n": 9}, "n"),
    ({"n": 8, "max_tokens": 5000}, "n"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function"}},
     "tool_choice"),
])
def test_chat_protocol_refusals(app, body, param):
    r = httpx.post(f"{app}/chat/completions", json={"model": "e2b", "messages": [{"role": "user", "content": "x"}],
                                                    **body}, timeout=60, headers=BEARER)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    if param == "tool_choice":
        assert '{"type": "function", "function": {"name":' in r.json()["error"]["message"]


def test_issue45_protocol_items(app):
    msgs = [{"role": "user", "content": "x"}]
    r = httpx.post(f"{app}/chat/completions", json={"model": "e2b", "messages": msgs, "n": None, "max_tokens": 2},
                   timeout=60, headers=BEARER)
    assert r.status_code == 200 and len(r.json()["choices"]) == 1, r.text
    r = httpx.post(f"{app}/chat/completions", json={"model": "e2b", "max_tokens": 2, "messages": [
        {"role": "user", "content": "x " * 51_000}]}, timeout=60, headers=BEARER)
    assert r.status_code == 400 and "the messages have 102000 characters" in r.json()["error"]["message"], r.text
    deep = json.dumps({"a": json.loads("[" * 60 + "]" * 60)})  # valid, 61 levels: rendered, not "not JSON"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    r = httpx.post(f"{app}/chat/completions", timeout=60, headers=BEARER, json={"model": "e2b", "max_tokens": 2,
                                                                               "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})
    assert r.status_code == 200, r.text
