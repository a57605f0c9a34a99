"""Constrained decoding and logprobs on the real graphs (fp32, tiny random-weight checkpoints, which cannot
write JSON or choose a tool on their own): grammars make forced tool calls and JSON valid by construction,
free rows beside constrained ones keep their solo tokens exactly, logprobs equal transformers' log-softmax
of the soft-capped logits, and the chat template renders thinking and tool conversations."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from neuron_workers.config import EngineConfig
from neuron_workers.engine.events import ErrorEvent
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine
from serve_app.openai.chat_output import ChatOutput
from serve_app.openai.constraints import json_grammar, thought_budget, tool_grammar

from conftest import hf_reference
from doubles.biased_backend import BiasedBackend

pytestmark = pytest.mark.slow
CTX = 1024
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "hourly": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
    "where": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                                "alt": {"type": ["integer", "null"]}},
              "required": ["lat"], "additionalProperties": False}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{2,4}$"}},
        "required": ["code"], "additionalProperties": False}  # `pattern`: a regex in the native grammar
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "lookup", "parameters": CODE}},
         {"type": "function", "function": {"name": "ping"}}]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "additionalProperties": False})
           for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def eng(tiny_dirs):
    return build_engine(EngineConfig(model=str(tiny_dirs["gemma4-e2b-tiny"]), max_context=CTX, max_batch=4))


def run(eng, seqs):
    out = {s.seq_id: [] for s in seqs}
    for ev in eng.run_all(seqs):
        out[ev.seq_id].append(ev)
    return [out[s.seq_id] for s in seqs]


def text(events):
    return "".join(e.text for e in events)


def params(i, n=120):
    return SamplingParams(max_tokens=n) if i == 0 else SamplingParams(max_tokens=n, temperature=1.0, seed=i)


@pytest.mark.parametrize("names,parallel,thinking", [(["get_weather"], False, False), (["lookup"], False, False),
                                                      (["get_weather", "lookup", "ping"], True, False),
                                                      (["get_weather"], False, True)])
def test_forced_tool_calls_parse_and_validate(eng, names, parallel, thinking):
    ids = eng.encode_chat(MSGS, tools=TOOLS, enable_thinking=thinking)
    g = tool_grammar(TOOLS, names, parallel=parallel, thinking=thinking, budget=thought_budget(200))
    seqs = [eng.new_sequence(ids, params(i, 200), grammar=eng.grammars.compile(g, "tools"), skip_special_tokens=False)
            for i in range(4)]
    ended = 0
    for events in run(eng, seqs):
        assert not any(isinstance(e, ErrorEvent) for e in events)
        out = ChatOutput(names, thinking)
        out.feed(text(events))
        out.flush()
        msg, finish = out.message(), out.finish_reason(events[-1].finish_reason)
        if events[-1].finish_reason == "length":  # a random model may list calls until max_tokens
            assert parallel  # a thought is bounded to a quarter of max_tokens: the call has the rest
            continue
        ended += 1
        assert finish == "tool_calls" and msg["content"] is None and msg["tool_calls"]
        assert len(msg["tool_calls"]) == 1 or parallel
        for c in msg["tool_calls"]:
            assert c["function"]["name"] in names
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    assert ended >= 2


BOUNDED = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                            "kind": {"enum": ["a", "b"]},
                                            "ok": {"type": "boolean"},
                                            "scores": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 9}, "maxItems": 3}},
           "required": ["name", "age", "kind", "ok", "scores"], "additionalProperties": False}


def test_bounded_json_schema_validates_and_stops(eng):
    ids = eng.encode_chat(MSGS)
    g = json_grammar(BOUNDED)
    seqs = [eng.new_sequence(ids, params(i, 200), grammar=eng.grammars.compile(g)) for i in range(4)]
    for events in run(eng, seqs):
        assert events[-1].finish_reason == "stop"
        obj = json.loads(text(events))
        jsonschema.validate(obj, BOUNDED)
        assert text(events) == json.dumps(obj, separators=(",", ":"), ensure_ascii=False)  # compact


def test_json_object_is_an_object(eng):
    """A random model never closes a free-form string on its own (it runs to max_tokens, an object's start);
    biased towards the tokens that close JSON, it ends, and what it wrote is an object."""
    ids = eng.encode_chat(MSGS)
    g = json_grammar({"type": "object"})
    events = run(eng, [eng.new_sequence(ids, SamplingParams(max_tokens=40), grammar=eng.grammars.compile(g))])[0]
    assert text(events).startswith("{") and events[-1].finish_reason == "length"
    one = {c: eng.encode(c)[-1] for c in '"}:1,'}
    real = eng.backend
    eng.backend = BiasedBackend(real, {one['"']: 5.0, one["}"]: 4.0, one[":"]: 3.5, one["1"]: 3.5, one[","]: 1.5})
    try:
        seqs = [eng.new_sequence(ids, params(i, 200), grammar=eng.grammars.compile(g)) for i in range(4)]
        res = run(eng, seqs)
    finally:
        eng.backend = real
    for events in res:
        assert events[-1].finish_reason == "stop"
        assert isinstance(json.loads(text(events)), dict)


def test_free_rows_beside_constrained_rows_keep_their_solo_tokens(eng):
    ids = eng.encode_chat(MSGS)
    free = [SamplingParams(max_tokens=30), SamplingParams(max_tokens=30, temperature=0.8, top_k=20, seed=7)]
    solo = [[e.token_id for e in run(eng, [eng.new_sequence(ids, p)])[0]] for p in free]
    g = json_grammar(BOUNDED)
    seqs = [eng.new_sequence(ids, free[0]), eng.new_sequence(ids, params(0, 60), grammar=eng.grammars.compile(g)),
            eng.new_sequence(ids, free[1]), eng.new_sequence(ids, params(3, 60), grammar=eng.grammars.compile(g),
                                                             logprobs=3)]
    res = run(eng, seqs)
    assert [e.token_id for e in res[0]] == solo[0] and [e.token_id for e in res[2]] == solo[1]
    jsonschema.validate(json.loads(text(res[1])), BOUNDED)


def test_logprobs_equal_transformers(eng, tiny_dirs):
    ids = eng.encode_chat(MSGS)
    events = run(eng, [eng.new_sequence(ids, SamplingParams(max_tokens=8), logprobs=5)])[0]
    hf = hf_reference(tiny_dirs["gemma4-e2b-tiny"])
    full = torch.tensor([ids + [e.token_id for e in events]])
    with torch.no_grad():
        logits = hf(full).logits[0, len(ids) - 1:-1].float()  # transformers applies the soft-cap itself
    lp = torch.log_softmax(logits, dim=-1)
    for i, e in enumerate(events):
        assert e.token_id == int(lp[i].argmax())  # greedy: the chosen token is the top one
        assert e.logprob == pytest.approx(float(lp[i, e.token_id]), abs=1e-4)
        top = torch.topk(lp[i], 5)
        assert [t for t, _ in e.top] == top.indices.tolist()
        assert [v for _, v in e.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_thinking_and_tool_conversation_render(eng):
    tok = eng.tokenizer
    plain, think = eng.encode_chat(MSGS), eng.encode_chat(MSGS, enable_thinking=True)
    assert 98 not in plain and 98 in think  # <|think|>
    rendered = tok.decode(think, skip_special_tokens=False)
    assert rendered.startswith("<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user")
    conv = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny, 21C"}]
    rendered = tok.decode(eng.encode_chat(conv, tools=TOOLS), skip_special_tokens=False)
    assert '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>' in rendered
    assert rendered.endswith('<|tool_response>response:get_weather{value:<|"|>sunny, 21C<|"|>}<tool_response|>')
    assert "<|tool>declaration:get_weather{description:" in rendered


class Broken:
    done = False

    def fill(self, bitmask, row):
        raise RuntimeError("grammar exploded")


def test_a_failing_grammar_fails_its_sequence_alone(eng):
    ids = eng.encode_chat(MSGS)
    good = eng.new_sequence(ids, SamplingParams(max_tokens=10))
    bad = eng.new_sequence(ids, SamplingParams(max_tokens=10), grammar=Broken())
    res = run(eng, [good, bad])
    assert isinstance(res[1][-1], ErrorEvent) and len(res[1]) == 1
    assert len(res[0]) == 10 and not any(isinstance(e, ErrorEvent) for e in res[0])


def test_a_grammar_the_tokenizer_cannot_serve_is_a_user_error(eng):
    with pytest.raises(UserError) as e:
        eng.grammars.compile('start: <|nope|> "x"\n', "tools")
    assert e.value.param == "tools" and "nope" in str(e.value)


def wide(n: int) -> dict:
    """An object of n optional properties: its grammar's parser row grows ~4 items a property."""
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def test_a_grammar_past_the_parser_limits_fails_its_row_as_the_requests_error(eng):
    """llguidance's default row limit (2,000) refused 600 properties at the first key; ours serves them. One
    past our limit (the router refuses such schemas first) fails its row alone, naming the field, in one
    short line (no parser dump), and the row beside it is untouched."""
    ids = eng.encode_chat(MSGS)
    ok = eng.new_sequence(ids, SamplingParams(max_tokens=12), grammar=eng.grammars.compile(json_grammar(wide(600))))
    bad = eng.new_sequence(ids, SamplingParams(max_tokens=12),
                           grammar=eng.grammars.compile(json_grammar(wide(3000)), "tools"))
    free = eng.new_sequence(ids, SamplingParams(max_tokens=12))
    res = run(eng, [ok, bad, free])
    assert not any(isinstance(e, ErrorEvent) for e in res[0] + res[2]) and len(res[2]) == 12
    assert text(res[0]).startswith("{")
    err = res[1][-1]
    assert isinstance(err, ErrorEvent) and err.param == "tools"
    assert "max is 10000" in err.message and "\n" not in err.message and "<state>" not in err.message


def test_a_thinking_tool_loop_continues_inside_the_thought_and_a_forced_call_closes_it(eng):
    """Under the 07-09 template the prompt after a tool response ends inside `<|channel>thought\\n`: the
    grammar's "open" variant finishes that thought (bounded) and then forces the call, and the output parser,
    started inside the channel, returns the thought as reasoning and the call as a tool call."""
    from serve_app.replica.render import ends_in_thought, render

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                       "arguments": {"city": "Paris", "unit": "celsius", "days": 1}}}
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "c1", "content": "18C"}]
    prompt = render(eng, msgs, TOOLS, enable_thinking=True)
    assert ends_in_thought(prompt)
    g = tool_grammar(TOOLS, ["get_weather"], parallel=False, thought="open", budget=thought_budget(200))
    seqs = [eng.new_sequence(eng.encode_rendered(prompt), params(i, 200), grammar=eng.grammars.compile(g, "tools"),
                             skip_special_tokens=False) for i in range(4)]
    for events in run(eng, seqs):
        assert events[-1].finish_reason == "stop" and "<channel|>" in text(events)
        out = ChatOutput(["get_weather"], True, False, in_thought=True)
        out.feed(text(events))
        out.flush()
        msg = out.message()
        assert out.finish_reason("stop") == "tool_calls" and msg["content"] is None and len(msg["tool_calls"]) == 1
        jsonschema.validate(json.loads(msg["tool_calls"][0]["function"]["arguments"]), SCHEMAS["get_weather"])
        thought = msg.get("reasoning_content") or ""
        assert "<|" not in thought and "channel|>" not in thought
