"""`POST /v1/responses`, stateless: a Responses API body becomes a chat request (`adapt.chat_request`: the same
validation, grammar-backed tool calls and JSON, sampling and engine request as a chat completion), and the chat
output parser's blocks (`blocks.Blocks`) become output items (`reasoning`, `message`, `function_call`), whole or
as the typed stream events. Nothing is stored: `previous_response_id` and `conversation` are 400s naming them,
`store` is answered `false`. Pure Python."""

from __future__ import annotations

import time
import uuid

from serve_app.openai.adapt import chat_request, content_of, image_url_part, need, of_type, text_of
from serve_app.openai.blocks import Blocks
from serve_app.openai.responses import sse

# chat field -> Responses field, for errors
NAMES = {"messages": "input", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
         "response_format": "text", "chat_template_kwargs": "reasoning"}
REFUSED = ("previous_response_id", "conversation", "prompt")  # state this server does not keep
TEXT_KINDS = ("input_text", "output_text", "text")
EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponsesBody:
    """A validated Responses API request: `.chat` is the chat request it stands for."""

    def __init__(self, data: dict, chat):
        self.data, self.chat, self.model, self.stream = data, chat, chat.model, chat.stream

    @classmethod
    def model_validate(cls, data) -> "ResponsesBody":  # the name `bodies.parse` calls
        need(isinstance(data, dict), "body", "must be a JSON object")
        return cls(data, chat_request(to_chat(data), NAMES))

    def payloads(self) -> list:
        return [self.chat.payload()]


def to_chat(d: dict) -> dict:
    """The chat completion body a Responses body stands for (its shape checked; the chat request checks the rest)."""
    for name in REFUSED:
        need(d.get(name) is None, name, "this server is stateless: send the whole conversation in `input`")
    need(not d.get("background"), "background", "background responses are not supported")
    chat = {k: d[k] for k in ("model", "temperature", "top_p", "top_k", "seed", "stream", "parallel_tool_calls",
                              "max_output_tokens") if d.get(k) is not None}
    if "max_output_tokens" in chat:
        chat["max_completion_tokens"] = chat.pop("max_output_tokens")
    messages = []
    if d.get("instructions") is not None:
        messages.append({"role": "system", "content": of_type(d["instructions"], str, "instructions", "a string")})
    need("input" in d, "input", "is required")
    messages += input_messages(d["input"])
    chat["messages"] = messages
    if d.get("tools") is not None:
        chat["tools"] = [tool(t, f"tools[{i}]") for i, t in enumerate(of_type(d["tools"], list, "tools", "a list"))]
    if d.get("tool_choice") is not None:
        chat["tool_choice"] = tool_choice(d["tool_choice"])
    fmt = (of_type(d["text"], dict, "text", "an object") if d.get("text") is not None else {}).get("format")
    if fmt is not None:
        chat["response_format"] = text_format(fmt)
    if d.get("reasoning") is not None:
        effort = of_type(d["reasoning"], dict, "reasoning", "an object").get("effort")
        need(effort in EFFORTS, "reasoning.effort", f"must be one of {', '.join(map(str, EFFORTS[1:]))}")
        chat["chat_template_kwargs"] = {"enable_thinking": effort != "none"}
    return chat


def input_messages(items) -> list[dict]:
    """`input` (a string, or input items: messages, function calls and their outputs, reasoning) as chat messages:
    consecutive function calls join one assistant turn, a reasoning item goes with the assistant turn after it."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    need(isinstance(items, list) and items, "input", "must be a string or a non-empty list of input items")
    out: list[dict] = []
    reasoning = None
    for i, item in enumerate(items):
        param = f"input[{i}]"
        need(isinstance(item, dict), param, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            need(role in ("user", "system", "developer", "assistant"), f"{param}.role",
                 "must be user, system, developer or assistant")
            msg = {"role": role, "content": content_of(item.get("content"), f"{param}.content", TEXT_KINDS, MEDIA)}
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = reasoning, None
            out.append(msg)
        elif kind == "function_call":
            call = {"id": of_type(item.get("call_id"), str, f"{param}.call_id", "a string"), "type": "function",
                    "function": {"name": of_type(item.get("name"), str, f"{param}.name", "a string"),
                                 "arguments": of_type(item.get("arguments"), str, f"{param}.arguments",
                                                      "a string")}}
            last = out[-1] if out else None
            if last and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if reasoning:
                    out[-1]["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": of_type(item.get("call_id"), str, f"{param}.call_id",
                                                                "a string"),
                        "content": text_of(output, f"{param}.output", TEXT_KINDS)})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            need(isinstance(parts, list), f"{param}.content", "must be a list of reasoning_text parts")
            reasoning = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
            reasoning = reasoning or None
        else:
            need(False, f"{param}.type", f"input items of type {str(kind)[:40]!r} are not supported (message, "
                                         "function_call, function_call_output, reasoning)")
    return out


def input_image(part: dict, param: str) -> dict:
    need(part.get("file_id") is None, f"{param}.file_id", "files are not stored here: send `image_url` (a data: URL)")
    return image_url_part(part.get("image_url"), f"{param}.image_url")


def input_audio(part: dict, param: str) -> dict:
    audio = of_type(part.get("input_audio"), dict, f"{param}.input_audio", "an object {data, format}")
    return {"type": "input_audio", "input_audio": {
        "data": of_type(audio.get("data"), str, f"{param}.input_audio.data", "a base64 string"),
        "format": of_type(audio.get("format"), str, f"{param}.input_audio.format", "a string (wav)")}}


MEDIA = {"input_image": input_image, "input_audio": input_audio}


def tool(t, param: str) -> dict:
    need(isinstance(t, dict), param, "must be an object")
    need(t.get("type") == "function", f"{param}.type",
         f"only function tools are supported, got {str(t.get('type'))[:40]!r}")
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    return {"type": "function", "function": fn}


def tool_choice(c):
    if isinstance(c, str):
        need(c in ("none", "auto", "required"), "tool_choice", 'must be "none", "auto", "required" or '
                                                               '{"type": "function", "name": ...}')
        return c
    need(isinstance(c, dict) and c.get("type") == "function" and isinstance(c.get("name"), str), "tool_choice",
         'an object names its function: {"type": "function", "name": "..."}')
    return {"type": "function", "function": {"name": c["name"]}}


def text_format(f) -> dict:
    need(isinstance(f, dict) and f.get("type") in ("text", "json_object", "json_schema"), "text.format",
         "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}")
    if f["type"] != "json_schema":
        return {"type": f["type"]}
    need(isinstance(f.get("schema"), dict), "text.format.schema", "a json_schema format needs a `schema` object")
    schema = {k: f[k] for k in ("name", "description", "schema", "strict") if f.get(k) is not None}
    return {"type": "json_schema", "json_schema": schema}


class ResponsesWriter:
    """One request's Response object, whole (`result`) or as the typed stream events (SSE with `event:` lines,
    each carrying its `sequence_number`)."""

    def __init__(self, body: ResponsesBody):
        self.body, self.chat = body, body.chat
        self.id, self.created, self.seq = new_id("resp"), int(time.time()), 0
        self.blocks: Blocks | None = None
        self.items: dict[int, dict] = {}

    def _open(self, first) -> Blocks:
        if self.blocks is None:
            self.blocks = Blocks.for_chat(self.chat, first)
        return self.blocks

    def response(self, status: str, output: list, ev=None, reason: str | None = None) -> dict:
        d = self.body.data
        usage = None
        if ev is not None:
            usage = {"input_tokens": ev.prompt_tokens,
                     "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                     "output_tokens": ev.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": ev.prompt_tokens + ev.completion_tokens}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.chat.model, "output": output, "usage": usage, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
                "instructions": d.get("instructions"), "max_output_tokens": d.get("max_output_tokens"),
                "parallel_tool_calls": self.chat.parallel_tool_calls, "previous_response_id": None,
                "reasoning": d.get("reasoning"), "store": False, "temperature": d.get("temperature"),
                "text": d.get("text") or {"format": {"type": "text"}}, "tool_choice": d.get("tool_choice", "auto"),
                "tools": d.get("tools") or [], "top_p": d.get("top_p"), "truncation": "disabled",
                "metadata": d.get("metadata") or {}}

    def result(self, events: list) -> dict:
        ev = events[0]
        blocks = self._open(ev)
        blocks.feed(ev.text)
        blocks.flush()
        reason = blocks.finish_reason(ev.finish_reason)
        output = [self._item(b, "completed") for b in blocks.blocks]
        return self.response("incomplete" if reason == "length" else "completed", output, ev, reason)

    def _item(self, b: dict, status: str) -> dict:
        """The output item of a block: whole when completed, empty when just added."""
        if "item_id" not in b:
            b["item_id"] = new_id({"reasoning": "rs", "text": "msg", "tool": "fc"}[b["kind"]])
        done = status == "completed"
        if b["kind"] == "reasoning":
            return {"type": "reasoning", "id": b["item_id"], "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": b["text"]}] if done else []}
        if b["kind"] == "text":
            return {"type": "message", "id": b["item_id"], "role": "assistant", "status": status,
                    "content": [self._part(b["text"])] if done else []}
        return {"type": "function_call", "id": b["item_id"], "call_id": b["id"], "name": b["name"],
                "arguments": b["text"] if done else "", "status": status}

    @staticmethod
    def _part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _event(self, kind: str, **fields) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **fields}, event=kind)

    def head(self, firsts) -> list[str]:
        self._open(firsts[0])
        started = self.response("in_progress", [])
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started)]

    def delta(self, i: int, ev) -> list[str]:
        return self._lines(self._open(ev).feed(ev.text))

    def finish(self, i: int, ev) -> list[str]:
        blocks = self._open(ev)
        lines = self._lines(blocks.feed(ev.text) + blocks.flush())
        reason = blocks.finish_reason(ev.finish_reason)
        output = [self._item(b, "completed") for b in blocks.blocks]
        status = "incomplete" if reason == "length" else "completed"
        return lines + [self._event(f"response.{status}", response=self.response(status, output, ev, reason))]

    def _lines(self, events) -> list[str]:
        out = []
        for e in events:
            b = e[1]
            at = {"output_index": b["index"], "item_id": b.get("item_id")}
            if e[0] == "open":
                item = self._item(b, "in_progress")
                at["item_id"] = b["item_id"]
                out.append(self._event("response.output_item.added", output_index=b["index"], item=item))
                if b["kind"] != "tool":
                    part = self._part("") if b["kind"] == "text" else {"type": "reasoning_text", "text": ""}
                    out.append(self._event("response.content_part.added", **at, content_index=0, part=part))
            elif e[0] == "delta":
                if b["kind"] == "tool":
                    out.append(self._event("response.function_call_arguments.delta", **at, delta=e[2]))
                elif b["kind"] == "text":
                    out.append(self._event("response.output_text.delta", **at, content_index=0, delta=e[2],
                                           logprobs=[]))
                else:
                    out.append(self._event("response.reasoning_text.delta", **at, content_index=0, delta=e[2]))
            else:
                out += self._closing(b, at)
        return out

    def _closing(self, b: dict, at: dict) -> list[str]:
        out = []
        if b["kind"] == "tool":
            out.append(self._event("response.function_call_arguments.done", **at, name=b["name"],
                                   arguments=b["text"]))
        elif b["kind"] == "text":
            out.append(self._event("response.output_text.done", **at, content_index=0, text=b["text"], logprobs=[]))
            out.append(self._event("response.content_part.done", **at, content_index=0, part=self._part(b["text"])))
        else:
            part = {"type": "reasoning_text", "text": b["text"]}
            out.append(self._event("response.reasoning_text.done", **at, content_index=0, text=b["text"]))
            out.append(self._event("response.content_part.done", **at, content_index=0, part=part))
        out.append(self._event("response.output_item.done", output_index=b["index"], item=self._item(b, "completed")))
        return out

    def fail(self, message: str, type_: str, param=None, code=None) -> list[str]:
        return [self._event("error", code=code or type_, message=message, param=param)]

    def end(self) -> list[str]:
        return []
