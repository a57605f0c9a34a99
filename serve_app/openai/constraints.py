"""Grammars for constrained decoding, built from the request (pure Python + llguidance, no torch).

* `json_grammar(schema)`: compact JSON (no free whitespace) matching a JSON Schema (`response_format`).
* `tool_grammar(tools, ...)`: Gemma-4's own call syntax, `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:42}
  <tool_call|>`, one call or several. Each tool's arguments follow its JSON Schema in Gemma's native value
  syntax, keys in the order the chat template renders them, so that a call re-renders exactly as the model
  wrote it (`native_grammar`; a schema it cannot hold is a 400 naming `tools`, never a JSON-bodied call).
* With thinking, either grammar allows a thought channel first ("optional"), or finishes the one the prompt
  opened ("open"), with at most `thought_budget(max_tokens)` tokens of thought (`thought_rules`).

Errors are `ConstraintError(param, message)`; the grammars are checked against the tokenizer on the
replica (`neuron_workers.engine.grammar`).
"""

from __future__ import annotations

import json

from llguidance import LLMatcher

from neuron_workers.engine.grammar import parser_limits, short
from serve_app.openai.native_grammar import ANNOTATIONS, NativeArgs, Unsupported

COMPACT = {"whitespace_flexible": False}


class ConstraintError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


THOUGHT_TOKENS = 512  # most tokens of thought before a forced call or JSON (random weights never end a thought)


def thought_budget(max_tokens: int | None) -> int:
    """Tokens a thought may take before the constrained part: at most a quarter of `max_tokens`, so that a call
    or a schema has the rest (a schema without bounds on its strings or numbers can still outgrow it)."""
    return max(1, min(THOUGHT_TOKENS, (max_tokens or 4 * THOUGHT_TOKENS) // 4))


def thought_rules(mode: str, budget: int) -> tuple[str, list[str]]:
    """(what `start` begins with, the rules) for the thought before the constrained part. "off": none;
    "optional": a whole thought channel or none; "open": the rest of the thought channel the prompt opened
    (the 07-09 template ends a thinking turn after a tool response with `<|channel>thought\\n`), then its end."""
    if mode == "off":
        return "", []
    rules = [f"thought_text[max_tokens={budget}]: /(.|\\n)*/"]
    if mode == "open":
        return "thought_text <channel|>", rules
    return "thought?", [*rules, "thought: <|channel> thought_text <channel|>"]


def json_grammar(schema: dict, param: str = "response_format", thought: str = "off", budget: int = 1) -> str:
    """JSON matching `schema` (compact), after a thought as `thought` says (`thought_rules`)."""
    try:
        if thought == "off":
            g = LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)
        else:
            prefix, rules = thought_rules(thought, budget)
            g = LLMatcher.grammar_from_lark("\n".join([f"start: {prefix} body", f"body: {inline_json(schema)}",
                                                       *rules]) + "\n")
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


def arguments_rule(name: str, params: dict | None, i: int) -> tuple[str, list[str]]:
    """(rule name, rules) for `NAME{...}` of tool i, in Gemma-4's native syntax (`native_grammar`)."""
    params = params or {"type": "object", "properties": {}, "additionalProperties": False}  # no arguments
    native = NativeArgs(f"t{i}", params)
    try:
        body = native.object({k: v for k, v in params.items() if k not in ANNOTATIONS})
    except Unsupported as e:
        raise ConstraintError("tools", f"the parameters of `{name}` cannot be constrained: {e}") from None
    fn = f"t{i}_call"
    return fn, [f'{fn}: {json.dumps(name)} {body}', *native.rules]


def tool_grammar(tools: list[dict], names: list[str], parallel: bool = True, thinking: bool = False,
                 thought: str | None = None, budget: int = THOUGHT_TOKENS) -> str:
    """Lark grammar of one (or with `parallel`, one or more) calls to the tools named in `names`, after a
    thought as `thought` says (`thought_rules`; default: "optional" with `thinking`, else "off")."""
    calls, rules = [], []
    for i, t in enumerate(tools):
        f = t["function"]
        if f["name"] in names:
            fn, rs = arguments_rule(f["name"], f.get("parameters"), i)
            calls.append(fn)
            rules += rs
    if not calls:
        raise ConstraintError("tool_choice", "no tool to call")
    prefix, thought_lines = thought_rules(thought or ("optional" if thinking else "off"), budget)
    lines = [f"start: {prefix} calls", "calls: call+" if parallel else "calls: call",
             f"call: <|tool_call> \"call:\" ({' | '.join(calls)}) <tool_call|>", *rules, *thought_lines]
    g = LLMatcher.grammar_from_lark("\n".join(lines) + "\n")
    check(g, "tools")  # e.g. minimum > maximum in an argument's schema: a 400 here, before any replica
    return g
