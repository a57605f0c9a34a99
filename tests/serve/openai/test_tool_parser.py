"""The Gemma-4 tool-call and reasoning parsers on scripted model outputs (control tokens kept), streamed
at every byte split and whole: calls become OpenAI tool_calls, the text outside them content, and call markup
never reaches content (parity cases with vLLM and ollama: test_parser_parity.py; thinking: test_parser_reasoning.py;
random outputs: test_parser_fuzz.py)."""

from __future__ import annotations

import json

import pytest

from serve_app.openai.chat_output import ChatOutput
from serve_app.openai.tool_parsers.gemma4 import CallSyntaxError, Gemma4ToolParser, parse_call

Q = '<|"|>'
NAMES = {"get_weather", "search", "noargs"}


def call(body: str) -> str:
    return f"<|tool_call>{body}<tool_call|>"


def run_whole(text, names=NAMES, thinking=False):
    out = ChatOutput(names, thinking)
    out.feed(text)
    out.flush()
    return out.message(), out.finish_reason("stop")


def run_split(text, cut, names=NAMES, thinking=False):
    """Streamed in two chunks at `cut`; the deltas reassembled the way a client does."""
    out = ChatOutput(names, thinking)
    deltas = out.feed(text[:cut]) + out.feed(text[cut:]) + out.flush()
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:  # the first delta of a call: index, id, type, name
                assert c["type"] == "function" and c["function"]["name"] and c["index"] not in calls
                calls[c["index"]] = {"id": c["id"], "name": c["function"]["name"], "arguments": ""}
            calls[c["index"]]["arguments"] += c["function"].get("arguments", "")
    return content, reasoning, [calls[i] for i in sorted(calls)]


CASES = {
    "one": (call(f"call:get_weather{{city:{Q}Paris{Q},days:3}}"), "",
            [("get_weather", {"city": "Paris", "days": 3})]),
    "several": (call(f"call:get_weather{{city:{Q}Oslo{Q}}}") + call("call:noargs{}"), "",
                [("get_weather", {"city": "Oslo"}), ("noargs", {})]),
    "nested": (call(f"call:search{{q:{Q}x{Q},opts:{{deep:true,tags:[{Q}a{Q},1.5,null,{{k:-2}}]}},n:1e3}}"), "",
               [("search", {"q": "x", "opts": {"deep": True, "tags": ["a", 1.5, None, {"k": -2}]}, "n": 1000.0})]),
    "tricky strings": (call(f'call:search{{q:{Q}a {{b}}, "c" [d]: e{Q}}}'), "",
                       [("search", {"q": 'a {b}, "c" [d]: e'})]),
    "text before": ("Let me check. " + call(f"call:get_weather{{city:{Q}Rome{Q}}}"), "Let me check.",
                    [("get_weather", {"city": "Rome"})]),
    "text around": ("A " + call("call:noargs{}") + "\n" + call("call:noargs{}") + "\n B ", "AB ",
                    [("noargs", {}), ("noargs", {})]),
    "json body": (call('call:search{"q":"x","n":2}'), "", [("search", {"q": "x", "n": 2})]),
    "empty value": (call("call:search{q:}"), "", [("search", {"q": ""})]),
    "unknown tool": (call("call:rm{}"), "", [("rm", {})]),  # as vLLM and ollama: the name the model wrote
    "no call in it": ("a" + call("oops") + call("call:x[1]") + "b", "ab", []),
    "cut by max_tokens": ("Hi " + "<|tool_call>call:search{n:2,q:" + Q + "unfini", "Hi", [("search", {"n": 2})]),
    "cut in the name": ("Hi " + "<|tool_call>call:sea", "Hi", []),
    "control tokens": ("Hello<turn|>", "Hello", []),
}


@pytest.mark.parametrize("name", CASES)
def test_calls_whole_and_at_every_split(name):
    text, content, calls = CASES[name]
    msg, finish = run_whole(text)
    want = [(n, a) for n, a in calls]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
    assert got == want
    assert msg["content"] == (content or (None if calls else ""))
    assert finish == ("tool_calls" if calls else "stop")
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in msg.get("tool_calls", []))
    for cut in range(len(text) + 1):
        c, _, streamed = run_split(text, cut)
        assert c == content, cut
        assert [(x["name"], json.loads(x["arguments"])) for x in streamed] == want, cut


def test_thinking_then_a_call():
    text = ("<|channel>thought\nThe user wants {weather}, call it.<channel|>"
            + call(f"call:get_weather{{city:{Q}Nice{Q}}}"))
    msg, finish = run_whole(text, thinking=True)
    assert msg["reasoning_content"] == "The user wants {weather}, call it."
    assert msg["content"] is None and finish == "tool_calls"
    for cut in range(len(text) + 1):
        content, reasoning, calls = run_split(text, cut, thinking=True)
        assert content == "" and reasoning == "The user wants {weather}, call it."
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Nice"})]


def test_thinking_never_leaks_into_content():
    text = "<|channel>thought\nsecret plan<channel|>The answer is 4.<turn|>"
    msg, _ = run_whole(text, names=(), thinking=True)
    assert msg == {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "secret plan"}


def test_without_tools_calls_are_dropped_not_shown():
    """No tools (or tool_choice "none"): no tool_calls, and the call's markup is not content either."""
    msg, finish = run_whole("Sure." + call(f"call:search{{q:{Q}x{Q}}}"), names=())
    assert msg == {"role": "assistant", "content": "Sure."} and finish == "stop"


@pytest.mark.parametrize("body", ["call:{}", "get{}", "call:x[1]", "", "call:", "call:two words"])
def test_parse_call_refuses(body):
    with pytest.raises(CallSyntaxError):
        parse_call(body)


@pytest.mark.parametrize("body,args", [("call:x{a:1", {"a": 1}), ("call:x{a:1}}", {"a": 1}), ("call:x{a:1,}", {"a": 1}),
                                       (f"call:x{{a:{Q}open}}", {"a": "open"}), ("call:x", {}),
                                       ("call:x{a:1e999,b:-Infinity,c:NaN}", {"a": "1e999", "b": "-Infinity",
                                                                              "c": "NaN"})])
def test_parse_call_reads_what_a_model_writes(body, args):
    assert parse_call(body) == ("x", args)


def test_parser_alone_streams_openai_deltas():
    p = Gemma4ToolParser({"f"})
    deltas = [d for ch in ("ok <|tool_", "call>call:f{a:", "1}<tool_call|>") for d in p.feed(ch)] + p.flush()
    assert deltas[0] == {"content": "ok"}  # the space before a call is not content
    first, args = deltas[1]["tool_calls"][0], deltas[2]["tool_calls"][0]
    assert first["index"] == 0 and first["function"] == {"name": "f", "arguments": ""} and first["id"]
    assert args == {"index": 0, "function": {"arguments": '{"a": 1}'}}


def test_parallel_tool_calls_false_returns_the_first_call_and_drops_the_rest():
    out = ChatOutput(["f", "g"], parallel_tool_calls=False)
    text = '<|tool_call>call:f{a:1}<tool_call|><|tool_call>call:g{b:2}<tool_call|>'
    out.feed(text)
    out.flush()
    msg = out.message()
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["f"]
    assert msg["content"] is None
