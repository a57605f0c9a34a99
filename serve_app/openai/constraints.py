"""Grammars for constrained decoding, built from the request (pure Python + llguidance, no torch).

* `json_grammar(schema)`: compact JSON (no free whitespace) matching a JSON Schema (`response_format`).
* `tool_grammar(tools, ...)`: Gemma-4's own call syntax, `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:42}
  <tool_call|>`, one call or several, optionally after a thought channel. Each tool's arguments follow its
  JSON Schema in Gemma's native value syntax (bare keys in `properties` order, strings between `<|"|>`):
  types, `enum`/`const`, `required`, `anyOf`/`oneOf`, string `minLength`/`maxLength`, nested objects,
  arrays with `items`/`minItems`/`maxItems`; numbers, integers and booleans are inline `%json` schemas
  (integer bounds, `multipleOf`). A schema using anything else (`pattern`, `format`, `$ref`, free-form
  objects...) gets a JSON-bodied call instead, `call:NAME{"key":"text"}` under llguidance's own JSON
  Schema support; the Gemma-4 parser reads both forms.

Strings in native calls hold no `<` (so no text can imitate a control token) and no control characters
but tab and newline.
Errors are `ConstraintError(param, message)`; the grammars are checked against the tokenizer on the
replica (`neuron_workers.engine.grammar`).
"""

from __future__ import annotations

import json
import re

from llguidance import LLMatcher

from neuron_workers.engine.grammar import parser_limits, short

COMPACT = {"whitespace_flexible": False}
ANNOTATIONS = {"description", "title", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "strict"}
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


class ConstraintError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class _Fallback(Exception):
    """This schema needs llguidance's JSON Schema support (a JSON-bodied call)."""


def json_grammar(schema: dict, param: str = "response_format") -> str:
    try:
        g = LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)
    except ValueError as e:
        raise ConstraintError(param, f"invalid JSON Schema: {e}") from None
    check(g, param)
    return g


def check(grammar: str, param: str, tokenizer=None) -> None:
    err = LLMatcher.validate_grammar(grammar, tokenizer, limits=parser_limits())
    if err:
        raise ConstraintError(param, f"the schema cannot be used for constrained decoding: {short(err)}")


def inline_json(schema) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": COMPACT} if isinstance(schema, dict) else schema)


class _Native:
    """Lark rules for one tool's arguments in Gemma-4's value syntax."""

    def __init__(self, prefix: str):
        self.prefix, self.rules, self.n = prefix, [], 0

    def rule(self, body: str, terminal: bool = False) -> str:
        self.n += 1
        name = f"{self.prefix}_{self.n}"
        name = name.upper() if terminal else name
        self.rules.append(f"{name}: {body}")
        return name

    def value(self, s) -> str:
        if not isinstance(s, dict) or not s:
            raise _Fallback  # `true` / `{}`: any value
        s = {k: v for k, v in s.items() if k not in ANNOTATIONS}
        if "enum" in s or "const" in s:
            values = s["enum"] if "enum" in s else [s["const"]]
            if not isinstance(values, list) or not values or set(s) - {"enum", "const", "type"}:
                raise _Fallback
            return self.rule(" | ".join(self.literal(v) for v in values))
        for key in ("anyOf", "oneOf"):
            if key in s:
                if set(s) != {key} or not isinstance(s[key], list) or not s[key]:
                    raise _Fallback
                return self.rule(" | ".join(self.value(x) for x in s[key]))
        t = s.get("type")
        if isinstance(t, list):
            if not t:
                raise _Fallback
            return self.rule(" | ".join(self.value({**s, "type": x}) for x in t))
        if t == "string":
            return self.string(s)
        if t in ("integer", "number", "boolean", "null"):
            return self.rule(inline_json(s))
        if t == "object":
            return self.object(s)
        if t == "array":
            return self.array(s)
        raise _Fallback

    @staticmethod
    def literal(v) -> str:
        if isinstance(v, str):
            if "<" in v or any(ord(c) < 32 for c in v):
                raise _Fallback
            return f'<|"|> {json.dumps(v)} <|"|>' if v else '<|"|> <|"|>'
        if isinstance(v, (dict, list)):
            raise _Fallback
        return json.dumps(json.dumps(v))

    def string(self, s) -> str:
        if set(s) - {"type", "minLength", "maxLength"}:
            raise _Fallback
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        if not isinstance(lo, int) or hi is not None and (not isinstance(hi, int) or hi < lo):
            raise _Fallback
        if hi == 0:
            return self.rule('<|"|> <|"|>')
        text = self.rule(f"/[^<\\x00-\\x08\\x0b-\\x1f]{{{lo},{'' if hi is None else hi}}}/", terminal=True)
        return self.rule(f'<|"|> {text} <|"|>' if lo else f'<|"|> {text}? <|"|>')

    def object(self, s) -> str:
        props, required = s.get("properties", {}), s.get("required", [])
        extra = set(s) - {"type", "properties", "required", "additionalProperties"}
        if extra or not isinstance(props, dict) or not isinstance(required, list) or set(required) - set(props):
            raise _Fallback
        if not props and s.get("additionalProperties", True) is not False:
            raise _Fallback  # a free-form object
        if any(not KEY.match(k) for k in props):
            raise _Fallback
        items = [(f'"{k}:" {self.value(v)}', k in required) for k, v in props.items()]
        # after[first]: the properties from i on, `first` when no property was written yet; built from the
        # last property back (no recursion: an object may have a thousand properties)
        after = {False: "", True: ""}
        for i in reversed(range(len(items))):
            body, req = items[i]
            reachable = all(not r for _, r in items[:i])  # `first` at i: every earlier property was optional
            nxt = {}
            for first in (False, True) if reachable else (False,):
                take = " ".join(x for x in ("" if first else '","', body, after[False]) if x)
                rest = after[first] or '""'
                nxt[first] = self.rule(take if req else f"{take} | {rest}")
            after = {True: "", **nxt}
        return self.rule(f'"{{" {after[True]} "}}"')

    def array(self, s) -> str:
        if set(s) - {"type", "items", "minItems", "maxItems"} or not isinstance(s.get("items"), dict):
            raise _Fallback
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        if not isinstance(lo, int) or hi is not None and (not isinstance(hi, int) or hi < lo):
            raise _Fallback
        if hi == 0:
            return self.rule('"[]"')
        v = self.value(s["items"])
        more = f'("," {v}){{{max(lo - 1, 0)},{"" if hi is None else hi - 1}}}'
        return self.rule(f'"[" {v} {more} "]"' if lo else f'"[" ({v} {more})? "]"')


def arguments_rule(name: str, params: dict | None, i: int) -> tuple[str, list[str]]:
    """(rule name, rules) for `NAME{...}` of tool i: native when the schema allows, JSON otherwise."""
    params = params or {"type": "object", "properties": {}, "additionalProperties": False}  # no arguments
    native = _Native(f"t{i}")
    try:
        body = native.object({k: v for k, v in params.items() if k not in ANNOTATIONS} | {"type": "object"})
        if params.get("type", "object") != "object":
            raise _Fallback
        rules = native.rules
    except _Fallback:
        body, rules = f"t{i}_json", [f"t{i}_json: {inline_json(params)}"]
    fn = f"t{i}_call"
    return fn, [f'{fn}: {json.dumps(name)} {body}', *rules]


def tool_grammar(tools: list[dict], names: list[str], parallel: bool = True, thinking: bool = False) -> str:
    """Lark grammar of one (or with `parallel`, one or more) calls to the tools named in `names`."""
    calls, rules = [], []
    for i, t in enumerate(tools):
        f = t["function"]
        if f["name"] in names:
            fn, rs = arguments_rule(f["name"], f.get("parameters"), i)
            calls.append(fn)
            rules += rs
    if not calls:
        raise ConstraintError("tool_choice", "no tool to call")
    lines = ["start: thought? calls" if thinking else "start: calls",
             "calls: call+" if parallel else "calls: call",
             f"call: <|tool_call> \"call:\" ({' | '.join(calls)}) <tool_call|>", *rules]
    if thinking:
        lines += ["thought: <|channel> THOUGHT <channel|>", "THOUGHT: /(.|\\n)*/"]
    g = LLMatcher.grammar_from_lark("\n".join(lines) + "\n")
    check(g, "tools")  # e.g. minimum > maximum in an argument's schema: a 400 here, before any replica
    return g
