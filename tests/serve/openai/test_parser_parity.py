"""Parity with vLLM's (`vllm/tool_parsers/gemma4_tool_parser.py`, its tests) and ollama's
(`model/parsers/gemma4.go`, `gemma4_test.go`) Gemma-4 parsers on the cases their public tests check, rewritten
here as whole model outputs through `ChatOutput`: each one streamed at every split (two chunks) and one character
at a time gives exactly the whole text's message. Where we differ from them on purpose, the case says why."""

from __future__ import annotations

import json

import pytest

from serve_app.openai.chat_output import ChatOutput
from serve_app.openai.tool_parsers.markers import CONTROL

Q = '<|"|>'


def call(body: str, close: bool = True) -> str:
    return "<|tool_call>" + body + ("<tool_call|>" if close else "")


def _streamed(chunks, **kw):
    out = ChatOutput(**kw)
    deltas = [d for c in chunks for d in out.feed(c)] + out.flush()
    calls: dict[int, list] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:
                calls[c["index"]] = [c["function"]["name"], ""]
            calls[c["index"]][1] += c["function"].get("arguments", "")
    return ("".join(d.get("content", "") for d in deltas), "".join(d.get("reasoning_content", "") for d in deltas),
            [tuple(calls[i]) for i in sorted(calls)])


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def settle(text: str, **kw):
    """(content, reasoning, [(name, args)]) of the whole text; every chunking gives the same."""
    kw.setdefault("tool_names", ["any"])
    out = ChatOutput(**kw)
    out.feed(text)
    out.flush()
    msg = out.message()
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])]
    whole = (msg["content"] or "", msg.get("reasoning_content") or "", calls)
    for cut in range(len(text) + 1):
        assert _streamed([text[:cut], text[cut:]], **kw) == whole, cut
    assert _streamed(list(text), **kw) == whole
    assert not any(t in whole[0] for t in CONTROL)
    return whole[0], whole[1], [(n, json.loads(a, parse_constant=_reject_constant)) for n, a in calls]


W = "get_weather"
CASES = {  # name: (model output, content, reasoning, calls, ChatOutput kwargs)
    # ollama TestGemma4Parser
    "plain": ("This is a simple response.", "This is a simple response.", "", [], {}),
    "thinking then content": ("<|channel>thought\nLet me think about this...<channel|>The answer is 42.",
                              "The answer is 42.", "Let me think about this...", [], {"thinking": True}),
    "two thought blocks": ("<|channel>first thought<channel|><|channel>second thought<channel|>Final answer.",
                           "Final answer.", "first thoughtsecond thought", [], {"thinking": True}),
    "thought only": ("<|channel>just thinking<channel|>", "", "just thinking", [], {"thinking": True}),
    "thinking off drops the channel": ("<|channel>this is not thinking<channel|>actual content", "actual content",
                                       "", [], {}),
    "call": (call(f"call:{W}{{location:{Q}Paris{Q}}}"), "", "", [(W, {"location": "Paris"})], {}),
    "two args": (call(f"call:{W}{{location:{Q}Paris{Q},units:{Q}metric{Q}}}"), "", "",
                 [(W, {"location": "Paris", "units": "metric"})], {}),
    "number, bool, null": (call("call:f{value:42,on:true,v:null,nested:{value:null}}"), "", "",
                           [("f", {"value": 42, "on": True, "v": None, "nested": {"value": None}})], {}),
    "nested and arrays": (call(f"call:p{{config:{{enabled:true,name:{Q}test{Q}}},items:[{Q}a{Q},{Q}b \"q\"{Q}]}}"),
                          "", "", [("p", {"config": {"enabled": True, "name": "test"}, "items": ["a", 'b "q"']})],
                          {}),
    "multiline string": (call(f"call:bash{{command:{Q}date\n{Q}}}"), "", "", [("bash", {"command": "date\n"})], {}),
    "quotes and backslashes kept": (call(f'call:s{{q:{Q}say \\"hi\\" then "raw"{Q},p:{Q}C:\\users\\bob{Q},'
                                         f'u:{Q}snow:\\u2603 \\x{Q}}}'), "", "",
                                    [("s", {"q": 'say \\"hi\\" then "raw"', "p": "C:\\users\\bob",
                                            "u": "snow:\\u2603 \\x"})], {}),
    "JSON-quoted beside native": (call(f'call:s{{query:"raw \\"quoted\\"",note:{Q}gemma "q"{Q},'
                                       f'k:"keep , oldText: literal"}}'), "", "",
                                  [("s", {"query": 'raw "quoted"', "note": 'gemma "q"',
                                          "k": "keep , oldText: literal"})], {}),
    "pretty-printed edits": (call(f"call:edit{{edits:[\n  {{ newText:{Q}# Guide\n\nUse \"x\".\n{Q},\n"
                                  f"   oldText:{Q}## 14\\n{Q}}} ]}}"), "", "",
                             [("edit", {"edits": [{"newText": '# Guide\n\nUse "x".\n', "oldText": "## 14\\n"}]})], {}),
    "several calls": (call(f"call:{W}{{location:{Q}Paris{Q}}}") + call(f"call:{W}{{location:{Q}London{Q}}}"), "",
                      "", [(W, {"location": "Paris"}), (W, {"location": "London"})], {}),
    "thinking then a call": (f"<|channel>thought\nI need the weather<channel|>{call(f'call:{W}{{location:{Q}P{Q}}}')}",
                             "", "I need the weather", [(W, {"location": "P"})], {"thinking": True}),
    "content then a call": ("Let me check that for you." + call(f"call:{W}{{location:{Q}P{Q}}}"),
                            "Let me check that for you.", "", [(W, {"location": "P"})], {}),
    "no close marker, object closed": (call(f'call:s{{query:{Q}say "hi"{Q}}}', close=False), "", "",
                                       [("s", {"query": 'say "hi"'})], {}),
    "extra close tags and a tool_response after a call": (call("call:f{}") + "<tool_call|>\n<|tool_response>Done.",
                                                          "Done.", "", [("f", {})], {}),
    "after a tool response (in_thought)": ("The user asked for files.<channel|>go.mod and go.sum", "go.mod and go.sum",
                                           "The user asked for files.", [], {"thinking": True, "in_thought": True}),
    "quoted scalars stay strings": (call(f"call:foo{{n:{Q}1{Q},b:{Q}true{Q},z:{Q}null{Q}}}"), "", "",
                                    [("foo", {"n": "1", "b": "true", "z": "null"})], {}),
    "reference example": (call(f"call:get_current_temperature{{detail_level:0,location:{Q}Paris, France{Q},"
                               f"unit:{Q}celsius{Q}}}"), "", "",
                          [("get_current_temperature", {"detail_level": 0, "location": "Paris, France",
                                                        "unit": "celsius"})], {}),
    # ollama's repairs (issue 15315): we read these without a schema
    "raw multiline string": (call("call:write{content:\n\n# Guide (AGENTS.md)\n\nIt covers `src/` and code, designed "
                                  "for the agent's use.}"), "", "",
                             [("write", {"content": "\n\n# Guide (AGENTS.md)\n\nIt covers `src/` and code, designed "
                                                    "for the agent's use."})], {}),
    "single quotes and a dangling delimiter": (call(f"call:grep{{include:{Q}*.py{Q},pattern:':\\s*\\w+'{Q},"
                                                    f"path:'/tmp'}}"), "", "",
                                               [("grep", {"include": "*.py", "pattern": ":\\s*\\w+", "path": "/tmp"})],
                                               {}),
    "string left open before the brace": (call(f"call:bash{{path:{Q}/tmp{Q},command:{Q}ls}}"), "", "",
                                           [("bash", {"path": "/tmp", "command": "ls"})], {}),
    "bare string before the next key": (call(f"call:write{{content:hello, world,mode:{Q}fast{Q}}}"), "", "",
                                        [("write", {"content": "hello, world", "mode": "fast"})], {}),
    "JSON-quoted with bad escapes": (call('call:open{path:"C:\\users\\bob\\f.txt",q:"a,b:c"}'), "", "",
                                     [("open", {"path": "C:\\users\\bob\\f.txt", "q": "a,b:c"})], {}),  # ollama: error
    # vLLM's tests
    "empty and blank arguments": (call("call:get_status{}") + call("call:g{   }"), "", "",
                                  [("get_status", {}), ("g", {})], {}),
    "mixed scalars": (call(f"call:f{{name:{Q}test{Q},count:42,active:true,score:3.14,flag:false}}"), "", "",
                      [("f", {"name": "test", "count": 42, "active": True, "score": 3.14, "flag": False})], {}),
    "delimited dict keys": (call(f"call:f{{outer:{{inner:{{{Q}3{Q}:{Q}new text{Q}}}}}}}"), "", "",
                            [("f", {"outer": {"inner": {"3": "new text"}}})], {}),
    "unterminated string": (call(f"call:f{{key:{Q}unterminated"), "", "", [("f", {"key": "unterminated"})], {}),
    "key without a value": (call("call:f{key:}") + call("call:g{key:"), "", "", [("f", {"key": ""}),
                                                                                ("g", {"key": ""})], {}),
    "trailing dot": (call("call:f{left:108.,right:22.8}"), "", "", [("f", {"left": 108.0, "right": 22.8})], {}),
    "malformed array": (call("call:f{:[t:[]}"), "", "", [("f", {"": ["t:[]"]})], {}),
    "brackets in strings, stray bracket": (call(f"call:f{{a:[[{Q}a]b{Q},{Q}c{Q}],{Q}tail{Q}],b:[42,]trailing}}"), "",
                                           "", [("f", {"a": [["a]b", "c"], "tail"], "b": [42]})], {}),
    "text before a call is trimmed": ("Let me check the weather for you. " + call(f"call:{W}{{l:{Q}Paris{Q}}}"),
                                      "Let me check the weather for you.", "", [(W, {"l": "Paris"})], {}),
    "names with hyphens and dots": (call(f"call:get-weather{{l:{Q}L{Q}}}") + call("call:weather.get{}"), "", "",
                                    [("get-weather", {"l": "L"}), ("weather.get", {})], {}),
    "HTML in a string": (call(f'call:write_file{{path:{Q}index.html{Q},content:{Q}<!DOCTYPE html>\n<html lang="zh">'
                              f'\n<head>\n  <meta charset="UTF-8">\n{Q}}}'), "", "",
                         [("write_file", {"path": "index.html", "content": '<!DOCTYPE html>\n<html lang="zh">\n<head>\n'
                                                                            '  <meta charset="UTF-8">\n'})], {}),
    "HTML after a call": (call(f"call:{W}{{l:{Q}P{Q}}}") + "<div>", "<div>", "", [(W, {"l": "P"})], {}),
    "trailing bare bool": (call(f"call:Edit{{file_path:{Q}src/env.py{Q},replace_all:false}}"), "", "",
                           [("Edit", {"file_path": "src/env.py", "replace_all": False})], {}),
    # vLLM: an unclosed call stays content, markup and all; we return the finished values (see the cut cases)
    "call cut in a string": (call(f"call:{W}{{location:{Q}London", close=False), "", "", [(W, {})], {}),
}


@pytest.mark.parametrize("name", CASES)
def test_parity_case(name):
    text, content, reasoning, calls, kw = CASES[name]
    assert settle(text, **kw) == (content, reasoning, calls)


CUT = {  # a call the text ends inside (max_tokens): only the values the model finished
    "call:f{a:1,b": {"a": 1}, "call:f{a:12": {}, f"call:f{{a:{Q}x": {}, "call:f{a:[1,2": {"a": [1]},
    "call:f{a:{b:1,c:tr": {"a": {"b": 1}}, "call:f{left:108.": {}, "call:f{a:hello,": {},
    "call:f{a:hi, b:": {"a": "hi"},  # the comma before `b:` ended the bare string
    f"call:f{{a:{Q}x{Q},b:": {"a": "x"}, "call:f{": {}, "call:f{a:1}": {"a": 1},
}


@pytest.mark.parametrize("body", CUT)
def test_a_call_cut_by_max_tokens_keeps_the_finished_values(body):
    assert settle("ok " + call(body, close=False)) == ("ok", "", [("f", CUT[body])])
