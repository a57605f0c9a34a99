"""The agentic parts of a chat request: `tools`, `tool_choice`, `response_format`, tool-call history, and
the grammar they ask for (`serve_app.openai.constraints`). Pure Python (pydantic + llguidance): the router checks
everything here before a replica sees the request, and an error is a 400 naming its `param`."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serve_app.openai.constraints import ConstraintError, json_grammar, thought_budget, tool_grammar
from serve_app.openai.media_parts import template_content

STRICT = ConfigDict(extra="ignore", strict=True)
NAME = r"^[A-Za-z0-9_.-]{1,64}$"


def text_only(v):
    """Refuse any string (keys included, at any depth) that is not valid Unicode text: a lone surrogate
    such as "\\ud800" cannot reach the tokenizer as UTF-8."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("contains an unpaired surrogate (not valid Unicode text)") from None
        elif isinstance(x, dict):
            stack += [*x.keys(), *x.values()]
        elif isinstance(x, list):
            stack += x
    return v


class FunctionDef(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None

    _text = field_validator("description", "parameters")(text_only)


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=NAME)
    arguments: str

    _text = field_validator("arguments")(text_only)


class ToolCall(BaseModel):
    model_config = STRICT

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    _text = field_validator("id")(text_only)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class TemplateKwargs(BaseModel):
    """The chat-template switches a request may set (only these: a request cannot override `messages`)."""

    model_config = STRICT

    enable_thinking: bool = False


MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES = 64, 20_000  # bounds on what the checkers and grammar builders walk
# properties of one object: each optional one adds ~4 items to a row of the grammar's parser (its limit,
# neuron_workers.engine.grammar.MAX_ITEMS_IN_ROW, is 10,000), and masks grow with them (~4 ms a token at 1,000)
MAX_PROPERTIES = 1_000


def schema_shape(schema) -> tuple[int, int, int]:
    """(nesting depth, number of values, most `properties` of one object) of a JSON value, walked without
    recursion."""
    depth, nodes, widest, stack = 0, 0, 0, [(schema, 1)]
    while stack:
        v, d = stack.pop()
        nodes, depth = nodes + 1, max(depth, d)
        if isinstance(v, dict):
            stack += [(x, d + 1) for x in v.values()]
            if isinstance(v.get("properties"), dict):
                widest = max(widest, len(v["properties"]))
        elif isinstance(v, list):
            stack += [(x, d + 1) for x in v]
    return depth, nodes, widest


def check_schema(schema: dict, param: str) -> None:
    """Refuse what is not a JSON Schema at all (a wrong `type`, a non-list `required`...), or is too deep or
    too large to check and compile (a recursion in the checker would be a 500, not the user's 400)."""
    depth, nodes, widest = schema_shape(schema)
    if depth > MAX_SCHEMA_DEPTH or nodes > MAX_SCHEMA_NODES:
        raise ConstraintError(param, f"the schema is too large: nesting depth {depth} (at most {MAX_SCHEMA_DEPTH}), "
                                     f"{nodes} values (at most {MAX_SCHEMA_NODES})")
    if widest > MAX_PROPERTIES:
        raise ConstraintError(param, f"the schema is too large: an object with {widest} properties (at most "
                                     f"{MAX_PROPERTIES})")
    try:
        import jsonschema
    except ImportError:  # llguidance still refuses what it cannot compile
        return
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ConstraintError(param, f"invalid JSON Schema: {e.message}") from None
    except RecursionError:
        raise ConstraintError(param, "the schema is too deeply nested to check") from None


def tool_names(tools: list[Tool] | None) -> list[str]:
    return [t.function.name for t in tools or ()]


def check_tools(tools: list[Tool] | None, choice) -> None:
    names = tool_names(tools)
    if len(set(names)) != len(names):
        raise ConstraintError("tools", "tool names must be unique")
    for t in tools or ():
        params = t.function.parameters
        if params is not None:
            check_schema(params, "tools")
            if params.get("type", "object") != "object":
                raise ConstraintError("tools", f"the parameters of `{t.function.name}` must be an object schema")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise ConstraintError("tool_choice", f"tool_choice names `{choice.function.name}`, which is not in tools")
    if choice == "required" and not names:
        raise ConstraintError("tool_choice", "tool_choice `required` needs tools")


def grammar_for(tools, choice, parallel: bool, response_format: ResponseFormat | None, thinking: bool,
                max_tokens: int | None = None) -> tuple[str | None, str | None, str | None]:
    """(grammar, its variant for a prompt that ends inside a thought channel, the param they come from) for what
    the request forces, or (None, None, None). With thinking, the grammar allows a thought channel before the
    call or the JSON, and the variant finishes the channel the prompt opened; both bound the thought
    (`constraints.thought_budget`). The replica picks one from what the template rendered."""
    check_tools(tools, choice)
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    fmt = response_format.type if response_format else "text"
    if forced and fmt != "text":
        raise ConstraintError("response_format", "response_format cannot be combined with a forced tool_choice")
    budget = thought_budget(max_tokens)
    modes = ("optional", "open") if thinking else ("off",)
    if forced:
        names = [choice.function.name] if isinstance(choice, NamedToolChoice) else tool_names(tools)
        dumped = [t.model_dump() for t in tools]
        try:
            made = [tool_grammar(dumped, names, parallel and choice == "required", thought=m, budget=budget)
                    for m in modes]
        except RecursionError:  # e.g. an object with thousands of optional properties
            raise ConstraintError("tools", "a tool's parameters are too large to constrain a call to") from None
        return made[0], (made[1] if thinking else None), "tools"
    if fmt == "text":
        return None, None, None
    if fmt == "json_schema":
        if response_format.json_schema is None:
            raise ConstraintError("response_format", "response_format json_schema needs `json_schema`")
        schema = response_format.json_schema.schema_
        check_schema(schema, "response_format")
    else:
        schema = {"type": "object"}
    made = [json_grammar(schema, "response_format", m, budget) for m in modes]
    return made[0], (made[1] if thinking else None), "response_format"


# tool-call arguments in history: the chat template renders them recursively (~4 interpreter frames a level), so
# a nesting past this would overflow the renderer's recursion in the replica
MAX_ARGUMENT_DEPTH = 64


def json_depth(text: str) -> int:
    """The deepest nesting of `[` / `{` in a JSON text (strings skipped), counted without recursion."""
    depth = most = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            most = max(most, depth)
        elif ch in "]}":
            depth -= 1
    return most


def on_fresh_stack(fn, *args):
    """fn(*args) on a new thread (whose stack starts empty), its exception raised here."""
    import threading

    out: list = [None, None]

    def run():
        try:
            out[0] = fn(*args)
        except Exception as e:  # noqa: BLE001 - raised again in the caller
            out[1] = e

    t = threading.Thread(target=run, name="fresh-stack")
    t.start()
    t.join()
    if out[1] is not None:
        raise out[1]
    return out[0]


def call_arguments(call_id: str, text: str) -> dict:
    """A history tool call's arguments as an object. The nesting is measured first (without recursion), so a
    deep but valid JSON text is refused for its depth, never misreported as not JSON by the decoder's recursion
    limit (which depends on how deep the caller's stack already is)."""
    if not text.strip():
        return {}
    depth = json_depth(text)
    if depth > MAX_ARGUMENT_DEPTH:
        raise ConstraintError("messages", f"tool call {call_id}: arguments nest {depth} levels deep (at most "
                                          f"{MAX_ARGUMENT_DEPTH})")
    try:
        try:
            args = json.loads(text)
        except RecursionError:  # the caller's own stack was already deep: decode on a fresh one
            args = on_fresh_stack(json.loads, text)
    except json.JSONDecodeError as e:
        raise ConstraintError("messages", f"tool call {call_id}: arguments are not JSON ({e.msg})") from None
    if not isinstance(args, dict):
        raise ConstraintError("messages", f"tool call {call_id}: arguments must be a JSON object")
    return args


def history(messages) -> tuple[dict, ...]:
    """Chat messages for the template: content as text, or as a list of text / image / audio items when it holds
    media (`media_parts.template_content`); tool-call arguments as objects, tool results with their call's id (and
    name when the client gave one), an assistant turn's reasoning."""
    out = []
    for m in messages:
        role = "assistant" if m.role == "model" else m.role
        msg = {"role": role, "content": template_content(m.content) if m.content is not None else None}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                args = call_arguments(c.id, c.function.arguments)
                if not isinstance(args, dict):
                    raise ConstraintError("messages", f"tool call {c.id}: arguments must be a JSON object")
                try:
                    text_only(args)  # JSON escapes such as "\\ud800" decode to lone surrogates
                except ValueError as e:
                    raise ConstraintError("messages", f"tool call {c.id}: arguments {e}") from None
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                           "arguments": args}})
            msg["tool_calls"] = calls
        if role == "tool":  # the template names the result from its call's id, else `name`, else "unknown"
            msg["tool_call_id"] = m.tool_call_id
            if m.name:
                msg["name"] = m.name
        if role == "assistant" and (m.reasoning_content or m.reasoning):
            msg["reasoning_content"] = m.reasoning_content or m.reasoning
        out.append(msg)
    return tuple(out)
