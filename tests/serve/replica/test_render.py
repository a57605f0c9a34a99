"""The replica renders a chat with the checkpoint's template and reads the result: text-plus-calls turns keep a
model turn open under every published template version (split under 07-09, the text dropped under April), and
a prompt ending inside a thought channel is recognised (07-09 with thinking after a tool response)."""

from __future__ import annotations

import pytest

from neuron_workers.testing.tiny_tokenizer import build_tokenizer
from serve_app.replica.render import ends_in_thought, model_turn_open, render

CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
LOOP = [{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"}]


class Engine:
    def __init__(self, variant: str):
        self.tok = build_tokenizer(template=variant)

    def render_chat(self, messages, tools=None, **kw):
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kw)


@pytest.mark.parametrize("variant", ["0709", "0709-31b", "april"])
@pytest.mark.parametrize("thinking", [False, True])
def test_a_text_plus_calls_turn_leaves_the_model_turn_open(variant, thinking):
    eng = Engine(variant)
    plain = eng.render_chat(LOOP, TOOLS, enable_thinking=thinking)
    assert not model_turn_open(plain)  # what the template does with the turn as it is
    text = render(eng, LOOP, TOOLS, enable_thinking=thinking)
    assert model_turn_open(text) and text.count("<|tool_call>call:get_weather") == 1
    kept = "Let me check." in text
    assert kept == variant.startswith("0709")  # split under 07-09 (text, then calls); dropped under April
    if kept:
        assert text.index("Let me check.") < text.index("<|tool_call>")
    assert ends_in_thought(text) == (thinking and variant.startswith("0709"))


def test_the_readers_of_a_rendering():
    assert ends_in_thought("<|turn>model\n<|tool_response>x<tool_response|><|channel>thought\n")
    assert not ends_in_thought("<|turn>model\n<|channel>thought\n<channel|>")
    assert model_turn_open("<|turn>user\nhi<turn|>\n<|turn>model\n")
    assert not model_turn_open("<|turn>model\nok<turn|>\n") and not model_turn_open("no turns")
    msgs = [{"role": "user", "content": "hi"}]
    assert render(Engine("0709"), msgs, None) == Engine("0709").render_chat(msgs)  # nothing to split
