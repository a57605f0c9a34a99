"""The agentic parts of a chat request: `tools`, `tool_choice`, `response_format`, tool-call history, and
the grammar they ask for (`serve_app.constraints`). Pure Python (pydantic + llguidance): the router checks
everything here before a replica sees the request, and an error is a 400 naming its `param`."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.constraints import ConstraintError, json_grammar, tool_grammar

STRICT = ConfigDict(extra="ignore", strict=True)
NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class FunctionDef(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


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


class ToolCall(BaseModel):
    model_config = STRICT

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


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


def check_schema(schema: dict, param: str) -> None:
    """Refuse what is not a JSON Schema at all (a wrong `type`, a non-list `required`...)."""
    try:
        import jsonschema
    except ImportError:  # llguidance still refuses what it cannot compile
        return
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ConstraintError(param, f"invalid JSON Schema: {e.message}") from None


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


def grammar_for(tools, choice, parallel: bool, response_format: ResponseFormat | None,
                thinking: bool) -> tuple[str | None, str | None]:
    """(grammar, the param it comes from) for what the request forces, or (None, None)."""
    check_tools(tools, choice)
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    fmt = response_format.type if response_format else "text"
    if forced and fmt != "text":
        raise ConstraintError("response_format", "response_format cannot be combined with a forced tool_choice")
    if forced:
        names = [choice.function.name] if isinstance(choice, NamedToolChoice) else tool_names(tools)
        dumped = [t.model_dump() for t in tools]
        return tool_grammar(dumped, names, parallel=parallel and choice == "required", thinking=thinking), "tools"
    if fmt == "json_object":
        return json_grammar({"type": "object"}), "response_format"
    if fmt == "json_schema":
        if response_format.json_schema is None:
            raise ConstraintError("response_format", "response_format json_schema needs `json_schema`")
        schema = response_format.json_schema.schema_
        check_schema(schema, "response_format")
        return json_grammar(schema), "response_format"
    return None, None


def history(messages) -> tuple[dict, ...]:
    """Chat messages for the template: tool-call arguments as objects, tool results with their tool's name."""
    out, names = [], {}
    for m in messages:
        role = "assistant" if m.role == "model" else m.role
        msg = {"role": role, "content": m.text() if m.content is not None else None}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                try:
                    args = json.loads(c.function.arguments) if c.function.arguments.strip() else {}
                except json.JSONDecodeError:
                    raise ConstraintError("messages", f"tool call {c.id}: arguments are not JSON") from None
                if not isinstance(args, dict):
                    raise ConstraintError("messages", f"tool call {c.id}: arguments must be a JSON object")
                names[c.id] = c.function.name
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                           "arguments": args}})
            msg["tool_calls"] = calls
        if role == "tool":
            msg["tool_call_id"] = m.tool_call_id
            msg["name"] = names.get(m.tool_call_id) or m.name or m.tool_call_id
        out.append(msg)
    return tuple(out)
