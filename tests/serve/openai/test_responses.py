"""Response bodies from replica events (`serve_app.openai.responses`), without a cluster: a thinking + tool-call
output streamed in odd pieces gives the same message as the non-stream body; logprobs in both shapes."""

from __future__ import annotations

import json

from serve_app.events import Delta, Finished
from serve_app.openai.protocol import ChatRequest, CompletionRequest
from serve_app.openai.responses import Output

Q = '<|"|>'
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "a": {"type": "string"}}}}}]
RAW = f"<|channel>thought\nplan<channel|>Sure<|tool_call>call:f{{a:{Q}x, y{Q}}}<tool_call|><turn|>"


def chat(**kw):
    return ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def entry(tok, lp):
    return {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": [
        {"token": tok, "logprob": lp, "bytes": list(tok.encode())}, {"token": "z", "logprob": lp - 1, "bytes": [122]}]}


def test_thinking_and_a_call_stream_like_the_whole_message():
    body = chat(tools=TOOLS, chat_template_kwargs={"enable_thinking": True})
    whole = Output(body, "r", True).result(Finished("stop", 5, 9, RAW))
    msg = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and msg["reasoning_content"] == "plan"
    assert msg["content"] == "Sure" and json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"a": "x, y"}
    out = Output(body, "r", True)
    chunks = out.start()
    for i in range(0, len(RAW), 7):
        chunks += out.delta(Delta(RAW[i:i + 7], ()))
    chunks += out.finish(Finished("stop", 5, 9))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure"
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "plan"
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "f" and calls[0]["id"].startswith("call_") and calls[0]["index"] == 0
    assert "".join(tc["function"].get("arguments", "") for tc in calls) == msg["tool_calls"][0]["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_choice_none_returns_no_calls_and_no_control_tokens():
    body = chat(tools=TOOLS, tool_choice="none")
    msg = Output(body, "r", True).result(Finished("stop", 5, 9, RAW))["choices"][0]["message"]
    assert "tool_calls" not in msg and "<" not in msg["content"]


def test_logprobs_shapes():
    body = chat(logprobs=True, top_logprobs=2)
    lps = (entry("He", -0.5), entry("llo", -0.25))
    res = Output(body, "r", True).result(Finished("length", 5, 2, "Hello", lps))
    assert res["choices"][0]["logprobs"] == {"content": list(lps)}
    comp = CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 2})
    out = Output(comp, "r", False)
    first, second = out.delta(Delta("He", (1,), lps[:1])), out.delta(Delta("llo", (2,), lps[1:]))
    lp1, lp2 = first[0]["choices"][0]["logprobs"], second[0]["choices"][0]["logprobs"]
    assert lp1 == {"tokens": ["He"], "token_logprobs": [-0.5], "top_logprobs": [{"He": -0.5, "z": -1.5}],
                   "text_offset": [0]}
    assert lp2["text_offset"] == [2] and lp2["tokens"] == ["llo"]
    plain = Output(chat(), "r", True).result(Finished("stop", 5, 2, "Hello"))
    assert plain["choices"][0]["logprobs"] is None and plain["choices"][0]["message"]["content"] == "Hello"
