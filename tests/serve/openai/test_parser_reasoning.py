"""Thought channels in the output (`serve_app.openai.reasoning` through `ChatOutput`), each case streamed at every
split and one character at a time: with thinking off any thought channel is removed (and a stray `thought\n`
label), with thinking on it is `reasoning_content`, and with `in_thought` (the prompt ended inside
`<|channel>thought\n`) the output starts as reasoning up to `<channel|>`."""

from __future__ import annotations

import pytest

from serve_app.openai.chat_output import ChatOutput
from serve_app.openai.tool_parsers.markers import CONTROL

Q = '<|"|>'
CALL = f"<|tool_call>call:f{{a:{Q}x{Q}}}<tool_call|>"


def _streamed(chunks, **kw):
    out = ChatOutput(**kw)
    deltas = [d for c in chunks for d in out.feed(c)] + out.flush()
    names = [c["function"]["name"] for d in deltas for c in d.get("tool_calls", []) if "id" in c]
    return ("".join(d.get("content", "") for d in deltas), "".join(d.get("reasoning_content", "") for d in deltas),
            names)


def settle(text: str, **kw):
    """(message, finish_reason) of the whole text; every chunking gives the same content, reasoning and calls."""
    out = ChatOutput(**kw)
    out.feed(text)
    out.flush()
    msg = out.message()
    whole = (msg["content"] or "", msg.get("reasoning_content") or "",
             [c["function"]["name"] for c in msg.get("tool_calls", [])])
    for cut in range(len(text) + 1):
        assert _streamed([text[:cut], text[cut:]], **kw) == whole, cut
    assert _streamed(list(text), **kw) == whole
    assert not any(t in whole[0] + whole[1] for t in CONTROL)
    return msg, out.finish_reason("stop")


OFF = {  # thinking off: model output -> content
    "the issue's example": ("<|channel>thought\nhmm<channel|>Hello!", "Hello!"),
    "31B's empty channel": ("<|channel>thought\n<channel|>\n\nHello", "Hello"),
    "a stray label": ("thought\nHello", "Hello"),
    "not a label": ("thoughtful\nHello", "thoughtful\nHello"),
    "the word in a sentence": ("thought about it", "thought about it"),
    "a label later on is text": ("Hi thought\nthere", "Hi thought\nthere"),
    "a channel never closed": ("Sure.<|channel>thought\nand then", "Sure."),
    "a stray close": ("a<channel|>b", "ab"),
    "other channel names": ("<|channel>analysis<channel|>Done", "Done"),
}


@pytest.mark.parametrize("name", OFF)
def test_thinking_off_removes_every_thought(name):
    text, content = OFF[name]
    msg, _ = settle(text, tool_names=["f"])
    assert msg == {"role": "assistant", "content": content}


def test_thinking_off_a_thought_then_a_call():
    msg, finish = settle("<|channel>thought\nI should call f<channel|>" + CALL, tool_names=["f"])
    assert msg["content"] is None and [c["function"]["name"] for c in msg["tool_calls"]] == ["f"]
    assert "reasoning_content" not in msg and finish == "tool_calls"


ON = {  # thinking on: model output -> (content, reasoning)
    "label and edges trimmed": ("<|channel>thought\n  the plan \n<channel|>\n\nAnswer", "Answer", "the plan"),
    "control tokens inside a thought dropped": ("<|channel>thought\na<turn|>b<channel|>c", "c", "ab"),
    "no thought": ("Just the answer", "Just the answer", None),
    "a thought cut by max_tokens": ("<|channel>thought\nstill thinking ", "", "still thinking"),
    "a stray label and no channel": ("thought\nAnswer", "Answer", None),
    "a call ends a thought left open": ("<|channel>thought\nlet me call" + CALL, "", "let me call"),
}


@pytest.mark.parametrize("name", ON)
def test_thinking_on_returns_the_thought_as_reasoning(name):
    text, content, reasoning = ON[name]
    msg, _ = settle(text, tool_names=["f"], thinking=True)
    assert (msg["content"] or "", msg["reasoning_content"]) == (content, reasoning)


IN = {  # in_thought (the prompt ended with `<|channel>thought\n`): model output -> (content, reasoning, calls)
    "reasoning, close, answer": ("The tool says 21C.\n<channel|>It is 21C in Paris.", "It is 21C in Paris.",
                                 "The tool says 21C.", []),
    "reasoning, close, a call": ("Need more.<channel|>" + CALL, "", "Need more.", ["f"]),
    "reasoning then a call, no close": ("Need more." + CALL, "", "Need more.", ["f"]),
    "an empty thought": ("<channel|>Done.", "Done.", None, []),
    "cut before the close": ("thinking and thinking", "", "thinking and thinking", []),
    "the model opens its own channel": ("<|channel>thought\nx<channel|>y", "y", "x", []),
    "thought is not a label here": ("thought\nabout it<channel|>ok", "ok", "thought\nabout it", []),
}


@pytest.mark.parametrize("name", IN)
def test_in_thought_starts_as_reasoning(name):
    text, content, reasoning, calls = IN[name]
    msg, finish = settle(text, tool_names=["f"], thinking=True, in_thought=True)
    assert (msg["content"] or "", msg["reasoning_content"]) == (content, reasoning)
    assert [c["function"]["name"] for c in msg.get("tool_calls", [])] == calls
    assert finish == ("tool_calls" if calls else "stop")


def test_in_thought_with_thinking_off_drops_the_thought():
    msg, _ = settle("private notes<channel|>Hello", tool_names=["f"], in_thought=True)
    assert msg == {"role": "assistant", "content": "Hello"}


def test_a_stream_gives_the_reasoning_before_the_answer():
    out = ChatOutput(["f"], thinking=True)
    deltas = out.feed("<|channel>thought\nplan<channel|>Answer") + out.flush()
    assert deltas == [{"reasoning_content": "plan"}, {"content": "Answer"}]
