"""Grammars from tools and schemas (`serve_app.openai.constraints`), walked at random under their own masks with the
tiny tokenizer (no model): every complete call parses into arguments that validate against its tool's schema,
native where the schema allows and JSON-bodied where it does not; JSON outputs validate and are compact."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance
import llguidance.hf
import pytest
from llguidance import LLMatcher

from neuron_workers.testing.tiny_tokenizer import build_tokenizer
from serve_app.openai.constraints import ConstraintError, json_grammar, tool_grammar
from serve_app.openai.tool_parsers.gemma4 import CLOSE, OPEN, parse_call

EOS = (1, 106, 50)
SCHEMAS = {
    "weather": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 8}, "unit": {"enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}, "exact": {"type": "number", "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
        "opt": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        "where": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                   "y": {"const": "here"}},
                  "required": ["x"], "additionalProperties": False}},
        "required": ["city", "unit"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{2,4}$"}},
                "required": ["code"], "additionalProperties": False},
    "none": None,
}
TOOLS = [{"type": "function", "function": {"name": n, **({"parameters": s} if s else {})}} for n, s in SCHEMAS.items()]


@pytest.fixture(scope="module")
def tok():
    return llguidance.hf.from_tokenizer(build_tokenizer(), n_vocab=512, eos_token=list(EOS))


def walk(tok, grammar: str, seed: int, limit: int = 400) -> tuple[str, bool]:
    """Random allowed tokens until the grammar ends; (text with control tokens, ended)."""
    m, rnd, out = LLMatcher(tok, grammar, log_level=0), random.Random(seed), []
    assert not m.is_error(), m.get_error()
    while not m.is_stopped() and len(out) < limit:
        mask = m.compute_bitmask()
        allowed = [i for i in range(512) if mask[i >> 3] >> (i & 7) & 1]
        t = rnd.choice(allowed)
        if t in EOS:
            break
        assert m.consume_token(t), m.get_error()
        out.append(t)
    return tok.decode_str(out), m.is_stopped() or m.is_accepting()


def test_native_where_possible_json_otherwise():
    g = tool_grammar(TOOLS, list(SCHEMAS))
    assert g.count("%json") >= 1 and '"city:"' in g
    assert tool_grammar(TOOLS, ["pattern"]).count('"code:"') == 0


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_random_walks_give_calls_that_validate(tok, name):
    g = tool_grammar(TOOLS, [name], parallel=False)
    assert LLMatcher.validate_grammar(g, tok) == ""
    schema = SCHEMAS[name] or {"type": "object", "additionalProperties": False}
    for seed in range(25):
        text, ended = walk(tok, g, seed)
        assert ended and text.startswith(OPEN + "call:" + name) and text.endswith(CLOSE), text
        got, args = parse_call(text[len(OPEN):-len(CLOSE)])
        assert got == name
        jsonschema.validate(args, schema)


def test_several_calls_and_a_thought_first(tok):
    g = tool_grammar(TOOLS, ["weather", "none"], parallel=True, thinking=True)
    assert LLMatcher.validate_grammar(g, tok) == ""
    m = LLMatcher(tok, g, log_level=0)
    scripted = '<|channel>thought\nlet me see<channel|><|tool_call>call:none{}<tool_call|>' \
               '<|tool_call>call:weather{city:<|"|>Oslo<|"|>,unit:<|"|>c<|"|>}<tool_call|>'
    assert m.consume_tokens(tok.tokenize_str(scripted, parse_special=True)), m.get_error()
    assert m.is_accepting()


def test_json_schema_walks_validate_and_are_compact(tok):
    schema = SCHEMAS["weather"]
    g = json_grammar(schema)
    for seed in range(25):
        text, ended = walk(tok, g, seed)
        assert ended
        obj = json.loads(text)
        jsonschema.validate(obj, schema)
        assert text == json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("schema,words", [({"type": "array", "uniqueItems": True}, "uniqueItems"),
                                          ({"type": "string", "format": "nope"}, "nope"),
                                          ({"type": "integer", "minimum": 3, "maximum": 1}, "minimum")])
def test_schemas_llguidance_cannot_honour_are_refused(schema, words):
    with pytest.raises(ConstraintError) as e:
        json_grammar(schema)
    assert e.value.param == "response_format" and words in str(e.value)
