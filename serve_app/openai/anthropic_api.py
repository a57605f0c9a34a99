"""`POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages API): a body becomes a chat request
(`adapt.chat_request`: the same validation, grammar-backed tool calls, sampling and engine request as a chat
completion) and the chat output parser's blocks (`blocks.Blocks`) become content blocks (`thinking`, `text`,
`tool_use`), whole or as Anthropic's stream events; errors take Anthropic's shape
(`{"type": "error", "error": {"type", "message"}}`). Pure Python."""

from __future__ import annotations

import json
import uuid

from serve_app.openai.adapt import chat_request, image_url_part, need, of_type, text_of
from serve_app.openai.blocks import Blocks
from serve_app.openai.responses import sse

NAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "chat_template_kwargs": "thinking",
         "response_format": "output_config.format",
         "tool_calls": "tool_use", "tool_call_id": "tool_use_id"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "request_too_large", 413: "request_too_large", 429: "rate_limit_error",
               431: "request_too_large", 503: "overloaded_error", 529: "overloaded_error"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


class MessagesBody:
    """A validated Messages request: `.chat` is the chat request it stands for."""

    count_only = False

    def __init__(self, data: dict, chat):
        self.data, self.chat, self.model, self.stream = data, chat, chat.model, chat.stream

    @classmethod
    def model_validate(cls, data) -> "MessagesBody":  # the name `bodies.parse` calls
        need(isinstance(data, dict), "body", "must be a JSON object")
        return cls(data, chat_request(to_chat(data, cls.count_only), NAMES))

    def payloads(self) -> list:
        return [self.chat.payload()]


class CountTokensBody(MessagesBody):
    count_only = True


def to_chat(d: dict, count_only: bool = False) -> dict:
    chat = {k: d[k] for k in ("model", "temperature", "top_p", "top_k", "stream") if d.get(k) is not None}
    if not count_only:
        need(d.get("max_tokens") is not None, "max_tokens", "is required")
        chat["max_completion_tokens"] = d["max_tokens"]
    need(d.get("temperature") is None or not isinstance(d["temperature"], (int, float)) or d["temperature"] <= 1,
         "temperature", "must be in [0, 1]")
    if d.get("stop_sequences") is not None:
        chat["stop"] = of_type(d["stop_sequences"], list, "stop_sequences", "a list of strings")
    messages = []
    if d.get("system") is not None:
        messages.append({"role": "system", "content": text_of(d["system"], "system", ("text",))})
    need(isinstance(d.get("messages"), list) and d["messages"], "messages", "must be a non-empty list")
    for i, m in enumerate(d["messages"]):
        messages += turn(m, f"messages[{i}]")
    chat["messages"] = messages
    if d.get("tools") is not None:
        chat["tools"] = [tool(t, f"tools[{i}]") for i, t in enumerate(of_type(d["tools"], list, "tools", "a list"))]
    if d.get("tool_choice") is not None:
        chat["tool_choice"], parallel = tool_choice(d["tool_choice"])
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    if d.get("thinking") is not None:
        t = of_type(d["thinking"], dict, "thinking", "an object")
        need(t.get("type") in ("enabled", "disabled", "adaptive", "between_tools"), "thinking.type",
             "must be enabled, disabled, adaptive or between_tools")
        chat["chat_template_kwargs"] = {"enable_thinking": t["type"] != "disabled"}
    fmt = (of_type(d["output_config"], dict, "output_config", "an object") if d.get("output_config") is not None
           else {}).get("format")
    if fmt is not None:  # structured output: the same grammar as a chat's response_format json_schema
        need(isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict),
             "output_config.format", 'must be {"type": "json_schema", "schema": {...}}')
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return chat


def turn(m, param: str) -> list[dict]:
    """One Messages turn as chat messages: a user turn's tool results first (as tool messages), then its text;
    an assistant turn's text, `tool_use` blocks as tool calls and `thinking` as its reasoning."""
    need(isinstance(m, dict), param, "must be an object")
    role = m.get("role")
    need(role in ("user", "assistant"), f"{param}.role", "must be user or assistant")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    need(isinstance(content, list), f"{param}.content", "must be a string or a list of content blocks")
    text, calls, results, thoughts, parts = [], [], [], [], []
    for j, b in enumerate(content):
        at = f"{param}.content[{j}]"
        need(isinstance(b, dict), at, "must be an object")
        kind = b.get("type")
        if kind == "text":
            text.append(of_type(b.get("text"), str, f"{at}.text", "a string"))
            parts.append({"type": "text", "text": text[-1]})
        elif kind == "image" and role == "user":
            parts.append(image_block(b, at))
        elif kind == "tool_use" and role == "assistant":
            args = of_type(b.get("input", {}), dict, f"{at}.input", "an object")
            calls.append({"id": of_type(b.get("id"), str, f"{at}.id", "a string"), "type": "function",
                          "function": {"name": of_type(b.get("name"), str, f"{at}.name", "a string"),
                                       "arguments": json.dumps(args)}})
        elif kind == "tool_result" and role == "user":
            result = b.get("content", "")
            results.append({"role": "tool", "tool_call_id": of_type(b.get("tool_use_id"), str, f"{at}.tool_use_id",
                                                                    "a string"),
                            "content": text_of(result, f"{at}.content", ("text",))})
        elif kind == "thinking" and role == "assistant":
            thoughts.append(of_type(b.get("thinking"), str, f"{at}.thinking", "a string"))
        elif kind == "redacted_thinking":
            continue
        else:
            need(False, f"{at}.type", f"content blocks of type {str(kind)[:40]!r} are not supported in a {role} turn")
    if role == "user":
        content = parts if len(parts) > len(text) else "".join(text)  # with images: the parts in order
        return results + ([{"role": "user", "content": content}] if parts or not results else [])
    msg = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    return [msg]


def image_block(b: dict, param: str) -> dict:
    """An `image` block (`source`: base64 with its media_type, or a url) as a chat `image_url` part."""
    src = of_type(b.get("source"), dict, f"{param}.source", "an object")
    if src.get("type") == "url":
        return image_url_part(src.get("url"), f"{param}.source.url")
    need(src.get("type") == "base64", f"{param}.source.type", 'must be "base64" or "url"')
    mime = of_type(src.get("media_type"), str, f"{param}.source.media_type", "a string (image/png, image/jpeg, ...)")
    data = of_type(src.get("data"), str, f"{param}.source.data", "a base64 string")
    return image_url_part(f"data:{mime};base64,{data}", f"{param}.source")


def tool(t, param: str) -> dict:
    need(isinstance(t, dict), param, "must be an object")
    need(t.get("type") in (None, "custom"), f"{param}.type",
         f"only client tools (name, input_schema) are supported, got {str(t.get('type'))[:40]!r}")
    need("input_schema" in t, f"{param}.input_schema", "is required")
    fn = {"name": t.get("name"), "parameters": t["input_schema"]}
    if t.get("description") is not None:
        fn["description"] = t["description"]
    return {"type": "function", "function": fn}


def tool_choice(c) -> tuple:
    """(the chat tool_choice, parallel_tool_calls or None) of Anthropic's auto / any / tool / none."""
    need(isinstance(c, dict) and c.get("type") in ("auto", "any", "tool", "none"), "tool_choice",
         'must be {"type": "auto" | "any" | "tool" | "none"} ({"type": "tool", "name": ...} names one)')
    parallel = None if c.get("disable_parallel_tool_use") is None else not c["disable_parallel_tool_use"]
    if c["type"] == "tool":
        need(isinstance(c.get("name"), str), "tool_choice.name", 'is required with {"type": "tool"}')
        return {"type": "function", "function": {"name": c["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[c["type"]], parallel


def stop_fields(reason: str | None, stop: str | None) -> dict:
    """Anthropic's stop_reason and stop_sequence: `stop_sequence` when one of the request's stop_sequences
    ended the output."""
    if reason == "stop" and stop is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop}
    return {"stop_reason": STOP_REASONS.get(reason) if reason else None, "stop_sequence": None}


class MessagesWriter:
    """One request's Message, whole (`result`) or as Anthropic's stream events."""

    def __init__(self, body: MessagesBody):
        self.body, self.chat, self.id = body, body.chat, new_id("msg")
        self.blocks: Blocks | None = None

    def _open(self, first) -> Blocks:
        if self.blocks is None:
            self.blocks = Blocks.for_chat(self.chat, first)
        return self.blocks

    def message(self, content: list, reason: str | None, prompt: int, completion: int,
                stop: str | None = None) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.chat.model, "content": content,
                **stop_fields(reason, stop), "usage": {"input_tokens": prompt, "output_tokens": completion}}

    @staticmethod
    def _block(b: dict, whole: bool = True) -> dict:
        if b["kind"] == "reasoning":
            return {"type": "thinking", "thinking": b["text"] if whole else "", "signature": ""}
        if b["kind"] == "text":
            return {"type": "text", "text": b["text"] if whole else ""}
        args = json.loads(b["text"]) if whole and b["text"].strip() else {}
        return {"type": "tool_use", "id": b["id"], "name": b["name"], "input": args}

    def result(self, events: list) -> dict:
        ev = events[0]
        blocks = self._open(ev)
        blocks.feed(ev.text)
        blocks.flush()
        return self.message([self._block(b) for b in blocks.blocks], blocks.finish_reason(ev.finish_reason),
                            ev.prompt_tokens, ev.completion_tokens, ev.stop_sequence)

    @staticmethod
    def _event(kind: str, **fields) -> str:
        return sse({"type": kind, **fields}, event=kind)

    def head(self, firsts) -> list[str]:
        self._open(firsts[0])
        self.prompt_tokens = getattr(firsts[0], "prompt_tokens", 0)
        return [self._event("message_start", message=self.message([], None, self.prompt_tokens, 0))]

    def delta(self, i: int, ev) -> list[str]:
        return self._lines(self._open(ev).feed(ev.text))

    def finish(self, i: int, ev) -> list[str]:
        blocks = self._open(ev)
        lines = self._lines(blocks.feed(ev.text) + blocks.flush())
        stop = stop_fields(blocks.finish_reason(ev.finish_reason), ev.stop_sequence)
        return lines + [self._event("message_delta", delta=stop,
                                    usage={"input_tokens": ev.prompt_tokens, "output_tokens": ev.completion_tokens}),
                        self._event("message_stop")]

    def _lines(self, events) -> list[str]:
        out = []
        for e in events:
            b = e[1]
            if e[0] == "open":
                out.append(self._event("content_block_start", index=b["index"], content_block=self._block(b, False)))
            elif e[0] == "delta":
                delta = {"reasoning": {"type": "thinking_delta", "thinking": e[2]},
                         "text": {"type": "text_delta", "text": e[2]},
                         "tool": {"type": "input_json_delta", "partial_json": e[2]}}[b["kind"]]
                out.append(self._event("content_block_delta", index=b["index"], delta=delta))
            else:
                if b["kind"] == "reasoning":
                    out.append(self._event("content_block_delta", index=b["index"],
                                           delta={"type": "signature_delta", "signature": ""}))
                out.append(self._event("content_block_stop", index=b["index"]))
        return out

    def fail(self, message: str, type_: str, param=None, code=None) -> list[str]:
        kind = "invalid_request_error" if type_ == "invalid_request_error" else "api_error"
        if code == "replica_unavailable":
            kind = "overloaded_error"
        return [sse({"type": "error", "error": {"type": kind, "message": message}}, event="error")]

    def end(self) -> list[str]:
        return []
