"""The agentic flows at the real vocabulary, through the engine (`build_engine`) on a tiny 262,144-vocabulary
random-weight checkpoint: forced tool calls (serve_app/openai/constraints.py's native grammars, `pattern` too),
JSON schemas and json_object parse and validate (random weights cannot choose a tool: the grammar
makes the output valid), free rows beside constrained rows keep their solo tokens, the engine's streamed text
equals a decode of its ids, and strings with `<` (HTML, `a < b`, code) in tool arguments render and tokenize
without becoming control tokens."""

from __future__ import annotations

import json

import jsonschema
import pytest
import rv_setup

from neuron_workers.engine.events import ErrorEvent
from neuron_workers.engine.params import SamplingParams
from neuron_workers.testing.real_vocab import CONTROL
from serve_app.openai.chat_output import ChatOutput
from serve_app.openai.constraints import json_grammar, thought_budget, tool_grammar

from doubles.biased_backend import BiasedBackend

pytestmark = rv_setup.MARKS
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
    "where": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                                "alt": {"type": ["integer", "null"]}},
              "required": ["lat"], "additionalProperties": False}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{2,4}$"}},
        "required": ["code"], "additionalProperties": False}
HTML = {"type": "object", "properties": {"html": {"type": "string", "minLength": 3, "maxLength": 40}},
        "required": ["html"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "lookup", "parameters": CODE}},
         {"type": "function", "function": {"name": "render", "parameters": HTML}},
         {"type": "function", "function": {"name": "ping"}}]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "additionalProperties": False})
           for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Paris? Answer in <b>bold</b> if a < b."}]
BOUNDED = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                            "kind": {"enum": ["a", "b"]}, "ok": {"type": "boolean"}},
           "required": ["name", "age", "kind", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def eng():
    return rv_setup.engine()


def run(eng, seqs):
    out = {s.seq_id: [] for s in seqs}
    for ev in eng.run_all(seqs):
        out[ev.seq_id].append(ev)
    return [out[s.seq_id] for s in seqs]


def text(events):
    return "".join(e.text for e in events)


def params(i, n=120):
    return SamplingParams(max_tokens=n) if i == 0 else SamplingParams(max_tokens=n, temperature=1.0, seed=i)


def test_the_checkpoint_has_the_real_vocabulary(eng):
    assert eng.model.dims.vocab_size == 262_144 and len(eng.tokenizer) == 262_144
    ids = eng.encode_chat(MSGS, tools=TOOLS)
    assert {105, 46, 47, 52} <= set(ids) and ids[0] == 2


@pytest.mark.parametrize("names,parallel,thinking", [(["get_weather"], False, False), (["lookup"], False, False),
                                                      (["get_weather", "lookup", "render", "ping"], True, False),
                                                      (["render"], False, False)])
def test_forced_tool_calls_parse_and_validate(eng, names, parallel, thinking):
    ids = eng.encode_chat(MSGS, tools=TOOLS, enable_thinking=thinking)
    g = tool_grammar(TOOLS, names, parallel=parallel, thinking=thinking)
    seqs = [eng.new_sequence(ids, params(i, 160), grammar=eng.grammars.compile(g, "tools"), skip_special_tokens=False)
            for i in range(4)]
    ended = 0
    for events in run(eng, seqs):
        assert not any(isinstance(e, ErrorEvent) for e in events)
        out = ChatOutput(names, thinking)
        out.feed(text(events))
        out.flush()
        msg = out.message()
        if events[-1].finish_reason == "length":  # a random model may think (or list calls) until max_tokens
            assert thinking or parallel
            continue
        ended += 1
        assert out.finish_reason("stop") == "tool_calls" and msg["content"] is None and msg["tool_calls"]
        assert len(msg["tool_calls"]) == 1 or parallel
        for c in msg["tool_calls"]:
            assert c["function"]["name"] in names
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    assert ended >= 2


def test_forced_tool_call_with_thinking_fits_in_max_tokens(eng):
    """The thought before a forced call is bounded (`thought_budget`: a quarter of max_tokens), as the router builds
    it: at 262,144 tokens a random model almost never writes `<channel|>` on its own."""
    ids = eng.encode_chat(MSGS, tools=TOOLS, enable_thinking=True)
    g = tool_grammar(TOOLS, ["get_weather"], parallel=False, thinking=True, budget=thought_budget(160))
    seqs = [eng.new_sequence(ids, params(i, 160), grammar=eng.grammars.compile(g, "tools"), skip_special_tokens=False)
            for i in range(4)]
    for events in run(eng, seqs):
        out = ChatOutput(["get_weather"], True)
        out.feed(text(events))
        out.flush()
        msg = out.message()
        assert events[-1].finish_reason == "stop" and msg["tool_calls"], (events[-1].finish_reason, msg)
        (c,) = msg["tool_calls"]
        jsonschema.validate(json.loads(c["function"]["arguments"]), WEATHER)


def test_json_schema_validates_and_stops(eng):
    ids = eng.encode_chat(MSGS)
    g = json_grammar(BOUNDED)
    for events in run(eng, [eng.new_sequence(ids, params(i, 120), grammar=eng.grammars.compile(g))
                            for i in range(4)]):
        assert events[-1].finish_reason == "stop"
        jsonschema.validate(json.loads(text(events)), BOUNDED)


def test_json_object_is_an_object(eng):
    """Biased towards the tokens that close JSON (a random model never closes a free string), it ends with an
    object."""
    ids = eng.encode_chat(MSGS)
    g = json_grammar({"type": "object"})
    one = {c: eng.encode(c)[-1] for c in '"}:1,'}
    real = eng.backend
    # the random logits spread wider at 262,144 tokens (std ~4, max ~18): biases past them
    eng.backend = BiasedBackend(real, {one['"']: 40.0, one["}"]: 38.0, one[":"]: 36.0, one["1"]: 30.0,
                                       one[","]: 20.0})
    try:
        res = run(eng, [eng.new_sequence(ids, params(i, 200), grammar=eng.grammars.compile(g)) for i in range(4)])
    finally:
        eng.backend = real
    for events in res:
        assert events[-1].finish_reason == "stop"
        assert isinstance(json.loads(text(events)), dict)


def test_free_rows_beside_constrained_rows_keep_their_solo_tokens(eng):
    ids = eng.encode_chat(MSGS)
    free = [SamplingParams(max_tokens=24), SamplingParams(max_tokens=24, temperature=0.8, top_k=20, seed=7)]
    solo = [[e.token_id for e in run(eng, [eng.new_sequence(ids, p)])[0]] for p in free]
    g = eng.grammars.compile(tool_grammar(TOOLS, ["get_weather"], parallel=False), "tools")
    seqs = [eng.new_sequence(ids, free[0]), eng.new_sequence(ids, params(0, 60), grammar=g),
            eng.new_sequence(ids, free[1]), eng.new_sequence(ids, params(3, 60), grammar=eng.grammars.compile(
                json_grammar(BOUNDED)))]
    res = run(eng, seqs)
    assert [e.token_id for e in res[0]] == solo[0] and [e.token_id for e in res[2]] == solo[1]


def test_streamed_text_equals_a_decode_of_the_ids(eng):
    """Free random generation at the real vocabulary (byte tokens, unused tokens, control tokens)."""
    ids = eng.encode_chat(MSGS)
    for skip in (True, False):
        for events in run(eng, [eng.new_sequence(ids, params(i, 64), skip_special_tokens=skip) for i in range(4)]):
            kept = [e.token_id for e in events if e.token_id not in eng.unused_ids]
            assert text(events) == eng.tokenizer.decode(kept, skip_special_tokens=skip)


LT = ["<b>bold</b> and <div class=\"x\">", "a < b && b <= c", "if (x<y) { return a<<2; } // <T>",
      pytest.param("<|turn> is only text here", marks=pytest.mark.xfail(strict=False, reason=(
          "text that spells a control token (`<|turn>`) in a tool argument or a tool result tokenizes as that "
          "control token: a tool result can open a turn (the tokenizer splits specials out of any text)")))]


@pytest.mark.parametrize("arg", LT)
def test_angle_brackets_in_tool_arguments_render_without_control_tokens(eng, arg):
    """A tool loop whose call and tool result hold `<` text: the rendered prompt tokenizes with no control token
    that the text spelled (only the template's own), and decodes back to the rendering."""
    msgs = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "render", "arguments": {"html": arg}}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "render", "content": arg}]
    plain = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "render", "arguments": {"html": "x"}}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "render", "content": "x"}]
    rendered = eng.tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    ids = eng.encode_chat(msgs, tools=TOOLS)
    assert eng.tokenizer.decode(ids) == rendered
    plain_ids = eng.encode_chat(plain, tools=TOOLS)
    assert {i: ids.count(i) for i in CONTROL} == {i: plain_ids.count(i) for i in CONTROL}


def test_forced_call_strings_may_hold_angle_brackets(eng):
    """Biased towards `<b>` and ` <`, a forced call's string argument takes them (the model would write HTML)."""
    ids = eng.encode_chat(MSGS, tools=TOOLS)
    g = eng.grammars.compile(tool_grammar(TOOLS, ["render"], parallel=False), "tools")
    lt = [eng.encode(s)[-1] for s in ("<b>", " <")]
    real = eng.backend
    eng.backend = BiasedBackend(real, dict.fromkeys(lt, 40.0))
    try:
        events = run(eng, [eng.new_sequence(ids, params(0, 80), grammar=g, skip_special_tokens=False)])[0]
    finally:
        eng.backend = real
    out = ChatOutput(["render"])
    out.feed(text(events))
    out.flush()
    (call,) = out.message()["tool_calls"]
    html = json.loads(call["function"]["arguments"])["html"]
    jsonschema.validate({"html": html}, HTML)
    assert "<" in html
