"""Tool schemas are rewritten to what the Gemma-4 templates render faithfully before the prompt is rendered
(serve_app/openai/schema_render.py): rendered as they come, they leave braces unclosed, print Python lists and
take `additionalProperties` for a property; rewritten, they render balanced, nullable, and say what they drop."""

from __future__ import annotations

from neuron_workers.testing.tiny_tokenizer import build_tokenizer
from serve_app.openai.schema_render import for_template, tool_for_template

AWKWARD = {"properties": {  # no "type" at the top
    "when": {"type": ["string", "null"], "format": "date"},
    "opts": {"type": "object", "additionalProperties": {"type": "integer"}},
    "n": {"anyOf": [{"type": "integer"}, {"type": "null"}], "minimum": 1},
    "node": {"$ref": "#/$defs/node"}, "level": {"type": "integer", "enum": [1, 2]}},
    "required": ["when"], "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}}


def declaration(params) -> str:
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": params}}
    text = build_tokenizer().apply_chat_template([{"role": "user", "content": "hi"}], tools=[tool], tokenize=False,
                                                 add_generation_prompt=True)
    return text[text.index("<|tool>"):text.index("<tool|>")]


def balanced(text: str) -> bool:
    depth = 0
    for c in text.replace('<|"|>', ""):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def test_as_they_come_the_templates_render_them_wrong():
    raw = declaration(AWKWARD)
    assert not balanced(raw) and "['STRING', 'NULL']" in raw and "additionalProperties:{" in raw


def test_rewritten_they_render_balanced_and_say_what_they_drop():
    out = declaration(for_template(AWKWARD))
    assert balanced(out) and "['" not in out and "additionalProperties" not in out and "$defs" not in out
    assert "when:{description:<|\"|>format: \"date\"<|\"|>,nullable:true,type:<|\"|>STRING<|\"|>}" in out
    assert "n:{description:<|\"|>minimum: 1<|\"|>,nullable:true,type:<|\"|>INTEGER<|\"|>}" in out
    assert "one of: [1, 2]" in out and "any keys, values of type integer" in out
    assert "node:{properties:{next:{properties:{},type:<|\"|>OBJECT<|\"|>}},type:<|\"|>OBJECT<|\"|>}" in out  # once


def test_a_tool_keeps_everything_but_its_parameters():
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"properties": {}}}}
    assert tool_for_template(tool) == {"type": "function", "function": {"name": "f", "description": "d",
                                                                        "parameters": {"type": "object",
                                                                                       "properties": {}}}}
