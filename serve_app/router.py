"""Router: the HTTP ingress. Maps `model` to its deployment handle and speaks OpenAI's API.

It never imports torch or a Neuron package (a process that initialised the Neuron runtime without
NEURON_RT_VISIBLE_CORES would reserve every core). Every error leaves in OpenAI's envelope:
unknown model 404, invalid request 400 (FastAPI's 422 is mapped), context too long 400
`context_length_exceeded`, a full queue 503 with Retry-After. The router waits for the replica's
first event before answering, so errors and back-pressure are real status codes, never a broken 200.
"""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app import protocol as P

log = logging.getLogger("ray.serve")
api = FastAPI(title="Gemma-4 on Inferentia2", version="0.1.0")
READY_TIMEOUT_S = 5.0


def error(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None, headers=None):
    return JSONResponse(P.error_body(message, type_, param, code), status_code=status, headers=headers)


@api.exception_handler(RequestValidationError)
async def _validation(request: Request, exc: RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid" or not loc and first.get("type") == "missing":
        return error(400, "the request body is not valid JSON", code="invalid_json")
    path = ".".join(x for x in loc if x not in _TYPE_NAMES and "[" not in x)  # drop union-branch names
    msg = first.get("msg", "invalid request").removeprefix("Value error, ")
    return error(400, f"{path}: {msg}" if path else msg, param=loc[0] if loc else None, code="invalid_value")


_TYPE_NAMES = {"str", "int", "float", "bool", "TextPart"}


@api.exception_handler(StarletteHTTPException)
async def _http(request: Request, exc: StarletteHTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error(exc.status_code, str(exc.detail), code=code)


@api.exception_handler(Exception)
async def _server_error(request: Request, exc: Exception):  # ours, never the user's: log it, answer in shape
    log.exception("request failed: %s", exc)
    return error(500, f"internal error: {type(exc).__name__}", "server_error", code="internal_error")


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class Router:
    def __init__(self, models: dict, max_context: dict | None = None):
        self.models = models  # name -> DeploymentHandle
        self.max_context = dict(max_context or {})

    @api.get("/v1/models")
    async def list_models(self):
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "gemma4-inf2",
                 "max_model_len": self.max_context.get(name)} for name in self.models]
        return {"object": "list", "data": data}

    @api.get("/health")
    async def health(self):
        async def one(name, handle):
            try:
                info = await asyncio.wait_for(handle.ready.remote(), READY_TIMEOUT_S)
                self.max_context[name] = info["max_context"]
                return name, "ready"
            except Exception as e:  # not started, pending resources, or failed
                return name, f"not ready ({type(e).__name__})"

        states = dict(await asyncio.gather(*(one(n, h) for n, h in self.models.items())))
        ok = all(s == "ready" for s in states.values())
        return JSONResponse({"status": "ok" if ok else "loading", "models": states}, status_code=200 if ok else 503)

    @api.post("/v1/chat/completions")
    async def chat(self, body: P.ChatRequest):
        return await self._serve(body, chat=True)

    @api.post("/v1/completions")
    async def completions(self, body: P.CompletionRequest):
        return await self._serve(body, chat=False)

    async def _serve(self, body, chat: bool):
        handle = self.models.get(body.model)
        if handle is None:
            return error(404, f"The model `{body.model}` does not exist.", param="model", code="model_not_found")
        gen = handle.options(stream=True).generate.remote(body.payload())
        try:
            first = await gen.__anext__()
        except BackPressureError:
            return error(503, f"model `{body.model}` is at capacity; retry later", "server_error",
                         code="overloaded", headers={"Retry-After": "1"})
        if first["type"] == "error":
            param = "messages" if chat and first.get("param") == "prompt" else first.get("param")
            return error(first["status"], first["message"], param=param, code=first.get("code"))
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._stream(gen, first, rid, body.model, chat, include_usage),
                                     media_type="text/event-stream")
        return await self._collect(gen, first, rid, body.model, chat)

    async def _collect(self, gen, first, rid, model, chat):
        text, end = [], None
        try:
            async for ev in gen:
                if ev["type"] == "delta":
                    text.append(ev["text"])
                elif ev["type"] == "end":
                    end = ev
                elif ev["type"] == "error":
                    return error(ev["status"], ev["message"], param=ev.get("param"), code=ev.get("code"))
        except asyncio.CancelledError:
            gen.cancel()
            raise
        build = P.chat_response if chat else P.completion_response
        return build(rid, model, "".join(text), end["finish_reason"], first["prompt_tokens"],
                     end["completion_tokens"])

    async def _stream(self, gen, first, rid, model, chat, include_usage):
        try:
            if chat:
                yield sse(P.chat_chunk(rid, model, {"role": "assistant", "content": ""}, None))
            async for ev in gen:
                if ev["type"] == "delta" and ev["text"]:
                    yield sse(P.chat_chunk(rid, model, {"content": ev["text"]}, None) if chat
                              else P.completion_chunk(rid, model, ev["text"], None))
                elif ev["type"] == "end":
                    yield sse(P.chat_chunk(rid, model, {}, ev["finish_reason"]) if chat
                              else P.completion_chunk(rid, model, "", ev["finish_reason"]))
                    if include_usage:
                        yield sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                                   "model": model, "choices": [],
                                   "usage": P.usage(first["prompt_tokens"], ev["completion_tokens"])})
                elif ev["type"] == "error":
                    yield sse(P.error_body(ev["message"], param=ev.get("param"), code=ev.get("code")))
            yield sse("[DONE]")
        except asyncio.CancelledError:  # the client went away: stop the replica's generation
            gen.cancel()
            raise
