"""Grammars from tools and schemas (`serve_app.openai.constraints`), walked at random under their own masks with the
tiny tokenizer (no model): every complete call is in Gemma-4's native syntax (for `pattern`, `format`, `$ref`,
`allOf`, free-form objects and arrays too), parses into arguments that validate against its tool's schema, and
re-renders through the template's spelling exactly as it was written; JSON outputs validate and are compact."""

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
from serve_app.openai.native_grammar import native_text
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
    "rerender": {"type": "object", "required": ["Zeta", "alpha"], "properties": {
        "Zeta": {"type": "string", "maxLength": 6}, "alpha": {"enum": ["a < b", "<b>x</b>", 3, None]},
        "beta": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "Gamma": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 99}}}}},
    "wide": {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0,
                                                                          "maximum": 9},
                                                                    "next": {"$ref": "#/$defs/node"}},
                                "required": ["v"]}},
             "type": "object", "required": ["day", "node"], "properties": {
                 "day": {"type": "string", "format": "date"}, "node": {"$ref": "#/$defs/node"},
                 "free": {"type": "object", "additionalProperties": {"type": "integer"}},
                 "any": {"type": "array", "maxItems": 2},
                 "maybe": {"type": "string", "nullable": True, "maxLength": 3},
                 "both": {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}},
                                    {"required": ["a"]}]},
                 "either": {"type": "string", "maxLength": 4, "anyOf": [{"pattern": "^x"}, {"pattern": "y$"}]}}},
}
REFUSED = {"not": {"not": {"type": "string"}}, "uniqueItems": {"type": "array", "uniqueItems": True},
           "#/nowhere": {"$ref": "#/nowhere"}}
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


def test_every_call_is_native():
    g = tool_grammar(TOOLS, list(SCHEMAS))
    assert '"city:"' in g and '"code:"' in g and '"{\\""' not in g and "%json {\"type\": \"object\"" not in g


@pytest.mark.parametrize("word", list(REFUSED))
def test_what_a_native_grammar_cannot_hold_is_refused_by_name(word):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": REFUSED[word]}}}}
    with pytest.raises(ConstraintError) as e:
        tool_grammar([tool], ["f"])
    assert e.value.param == "tools" and word in str(e.value)


@pytest.mark.parametrize("name", [n for n in SCHEMAS if n != "wide"])  # "wide" has unbounded free-form parts
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
        if name in ("rerender", "none", "pattern"):  # no free-form keys, no float spellings: exactly as written
            assert text == f"{OPEN}call:{name}{native_text(args)}{CLOSE}"


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


WIDE_OK = ('{any:[<|"|>a < b<|"|>,{k:[1,null]}],both:{a:true},day:<|"|>2026-12-02<|"|>,either:<|"|>xy<|"|>,'
           'free:{n:3,m:-1},maybe:null,node:{next:{v:2},v:1}}')
WIDE_BAD = ['{day:<|"|>02-12-2026<|"|>,node:{v:1}}',  # not a date
            '{both:{},day:<|"|>2026-12-02<|"|>,node:{v:1}}',  # `a` is required by allOf
            '{day:<|"|>2026-12-02<|"|>,either:<|"|>ab<|"|>,node:{v:1}}',  # neither pattern
            '{day:<|"|>2026-12-02<|"|>,node:{v:1},any:[]}']  # out of template order


def test_formats_refs_allof_free_form_and_nullable_hold_natively(tok):
    g = tool_grammar(TOOLS, ["wide"], parallel=False)
    assert LLMatcher.validate_grammar(g, tok) == ""

    def accepts(args: str) -> bool:
        m = LLMatcher(tok, g, log_level=0)
        ids = tok.tokenize_str(f"{OPEN}call:wide{args}{CLOSE}", parse_special=True)
        return m.consume_tokens(ids) and m.is_accepting()

    assert accepts(WIDE_OK)
    _, args = parse_call(f"call:wide{WIDE_OK}")
    as_json_schema = json.loads(json.dumps(SCHEMAS["wide"]))  # `nullable` is OpenAPI's: jsonschema reads a type list
    as_json_schema["properties"]["maybe"] = {"type": ["string", "null"], "maxLength": 3}
    jsonschema.validate(args, as_json_schema)
    for bad in WIDE_BAD:
        assert not accepts(bad), bad
