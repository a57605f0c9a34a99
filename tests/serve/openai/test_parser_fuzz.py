"""Random model outputs through `ChatOutput` (seeded, so reproducible): the parser never raises, whatever the
text, the request's flags or the chunking; the chunking never changes the result; arguments are always strict JSON
objects (no NaN / Infinity); no control token reaches `content` or `reasoning_content`. Also the extremes: nesting
far past any recursion limit, and long outputs streamed one character at a time in linear time."""

from __future__ import annotations

import json
import random
import time

import pytest

from serve_app.openai.chat_output import ChatOutput
from serve_app.openai.tool_parsers.gemma4 import parse_call, read_call
from serve_app.openai.tool_parsers.markers import CONTROL

Q = '<|"|>'
PIECES = (list(CONTROL) + ["<|tool_call>call:f{", "<|tool_call>call:g{", "call:", "thought\n", "<channel|>", Q, Q,
                           "{", "}", "[", "]", ",", ":", "a:", "b:", "'", '"', "\\", " ", "\n", "1", "-", ".", "5", "e",
                           "999", "1e999", "None", "null", "true", "NaN", "Infinity", "x", "hello", "<", "|", ">",
                           "é", "\u2603"])


def _strict(name):
    raise ValueError(name)


def _outcome(chunks, **kw):
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


def _chunkings(text, rnd):
    yield [text]
    yield list(text)
    for _ in range(3):
        cuts = sorted(rnd.sample(range(len(text) + 1), min(len(text) + 1, rnd.randint(1, 6))))
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("seed", range(12))
def test_random_outputs_never_raise_and_always_agree(seed):
    rnd = random.Random(seed)
    for _ in range(40):
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 40)))
        kw = {"tool_names": rnd.choice([[], ["f"], ["f", "g"]]), "thinking": rnd.random() < 0.5,
              "parallel_tool_calls": rnd.random() < 0.7, "in_thought": rnd.random() < 0.3}
        results = {json.dumps(_outcome(ch, **kw)) for ch in _chunkings(text, rnd)}
        assert len(results) == 1, (text, kw)
        content, reasoning, calls = json.loads(results.pop())
        assert not any(t in content or t in reasoning for t in CONTROL), (text, kw)
        for _name, args in calls:
            assert isinstance(json.loads(args, parse_constant=_strict), dict), (text, args)
        if not kw["tool_names"]:
            assert calls == []
        if not kw["parallel_tool_calls"]:
            assert len(calls) <= 1


@pytest.mark.parametrize("seed", range(4))
def test_random_call_bodies_read_as_json_objects(seed):
    rnd = random.Random(100 + seed)
    for _ in range(300):
        body = "call:f{" + "".join(rnd.choice(PIECES[len(CONTROL):]) for _ in range(rnd.randint(0, 30)))
        for final in (True, False):
            got = read_call(body, final)
            assert got is not None and got[0] == "f"
            json.loads(json.dumps(got[1], allow_nan=False))


def test_nesting_past_the_recursion_limit():
    for deep in ("[" * 5000, "{a:" * 5000, "[{a:" * 3000 + "1" + "}]" * 3000):
        name, args = parse_call(f"call:f{{x:{deep}}}")
        assert name == "f" and json.dumps(args, allow_nan=False)
        assert read_call(f"call:f{{x:{deep}", final=False)[0] == "f"


def test_long_outputs_stream_in_linear_time():
    body = ",".join(f"k{i}:{Q}v {i}, x{Q}" for i in range(1500))
    for text in ("<|tool_call>call:f{" + body + "}<tool_call|>", "plain text, " * 3000,
                 "<|tool_call>call:f{" + ",".join(f"k{i}:'x" for i in range(3000)) + "}<tool_call|>",
                 "<|tool_call>call:f{a:" + "word, " * 5000 + "}<tool_call|>"):
        start = time.perf_counter()
        out = ChatOutput(["f"], thinking=True)
        for i in range(0, len(text), 4):  # about a token at a time
            out.feed(text[i:i + 4])
        out.flush()
        assert time.perf_counter() - start < 3.0
