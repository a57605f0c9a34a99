"""Router: the HTTP ingress. Maps `model` to its deployment handle and speaks OpenAI's API.

It never imports torch or a Neuron package (a process that initialised the Neuron runtime without
NEURON_RT_VISIBLE_CORES would reserve every core). Every error leaves in OpenAI's envelope:
missing or wrong API key 401 and a body over the limit 413 (`gate.Gate`, before any parsing), unknown
model 404, invalid request 400 naming the `param` (FastAPI's 422 is mapped; an OpenAI field we do not
implement is refused by name), context too long 400 `context_length_exceeded`, a full queue 503
`overloaded`, a replica that died 503 `replica_unavailable`, a server draining for shutdown 503
`shutting_down` (`drain.Drain`), all with Retry-After. The router waits for
the replica's first event before answering, so errors and back-pressure are real status codes; once a
stream has started, a failure is one `data: {"error": ...}` event followed by `data: [DONE]`.
`GET /metrics` serves the Prometheus text of every node's Ray metrics agent on the HTTP port.
"""

import asyncio
import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.events import Delta, Failed, Finished
from serve_app.openai import bodies
from serve_app.openai import protocol as P
from serve_app.openai.constraints import ConstraintError
from serve_app.openai.responses import Output
from serve_app.ops import drain, gate, health
from serve_app.ops.metrics import prometheus_text

log = logging.getLogger("ray.serve")
api = FastAPI(title="Gemma-4 on Inferentia2", version="0.1.0")
api.add_middleware(gate.Gate)
api.add_middleware(drain.Drain)  # outermost: counts every /v1 request in flight (serve_app/ops/drain.py)
RETRY = {"Retry-After": "1"}
REPLICA_GONE = (RayActorError, ActorUnavailableError)  # the replica died or restarts: retryable


def error(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None, headers=None):
    return JSONResponse(P.error_body(message, type_, param, code), status_code=status, headers=headers)


@api.exception_handler(RequestValidationError)
async def _validation(request: Request, exc: RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid" or not loc and first.get("type") == "missing":
        return error(400, "the request body is not valid JSON", code="invalid_json")
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, P.UnsupportedField):
        return error(400, str(cause), param=cause.name, code="unsupported_parameter")
    if isinstance(cause, ConstraintError):
        return error(400, str(cause), param=cause.param, code="invalid_value")
    path = ".".join(x for x in loc if x not in _TYPE_NAMES and "[" not in x)  # drop union-branch names
    msg = first.get("msg", "invalid request").removeprefix("Value error, ")
    return error(400, f"{path}: {msg}" if path else msg, param=loc[0] if loc else None, code="invalid_value")


_TYPE_NAMES = {"str", "int", "float", "bool", "TextPart"}


@api.exception_handler(bodies.BodyError)
async def _body(request: Request, exc: bodies.BodyError):
    return error(400, str(exc), code="invalid_json")


@api.exception_handler(ConstraintError)
async def _constraint(request: Request, exc: ConstraintError):
    return error(400, str(exc), param=exc.param, code="invalid_value")


@api.exception_handler(StarletteHTTPException)
async def _http(request: Request, exc: StarletteHTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error(exc.status_code, str(exc.detail), code=code)


@api.exception_handler(Exception)
async def _server_error(request: Request, exc: Exception):  # ours, never the user's: log it, answer in shape
    if drain.cancelled(exc):  # the client went away: one line, no traceback (nobody is left to answer)
        log.info("client disconnected: %s %s cancelled", request.method, request.url.path)
        return error(499, "client closed the request", "server_error", code="client_closed_request")
    log.exception("request failed: %s", exc)
    return error(500, f"internal error: {type(exc).__name__}", "server_error", code="internal_error")


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def overloaded(model: str) -> JSONResponse:
    return error(503, f"model `{model}` is at capacity; retry later", "server_error", code="overloaded",
                 headers=RETRY)


def failed(ev: Failed, chat: bool) -> JSONResponse:
    """A replica's refusal as the HTTP error it stands for (a chat's prompt is its `messages`)."""
    param = "messages" if chat and ev.param == "prompt" else ev.param
    return error(ev.status, ev.message, ev.type, param=param, code=ev.code)


def replica_gone(model: str, e: Exception) -> JSONResponse:
    log.warning("replica of %s unavailable: %s", model, e)
    return error(503, f"the replica serving `{model}` stopped; retry the request", "server_error",
                 code="replica_unavailable", headers=RETRY)


# Serve pickles this class when the decorator runs: every helper it uses must be defined above.
@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class Router:
    def __init__(self, models: dict, max_context: dict | None = None, key_digests: list[str] | None = None,
                 max_request_bytes: int = gate.DEFAULT_MAX_REQUEST_BYTES, ops: dict | None = None):
        # name -> DeploymentHandle, over Serve's gRPC transport: a handle keeps the options of the process
        # that built the app (where RAY_SERVE_USE_GRPC_BY_DEFAULT is unset), and a Ray actor call per request
        # and per streamed message cost the router and the replica ~60% more CPU a stream (README, "Limits")
        self.models = {name: h.options(_by_reference=False) for name, h in models.items()}
        self.max_context = dict(max_context or {})
        # through the module (Serve ships this class by value: a name bound here would be a copy)
        gate.SETTINGS.key_digests, gate.SETTINGS.max_request_bytes = list(key_digests or []), max_request_bytes
        ops = ops or {}
        gate.SETTINGS.max_header_bytes = ops.get("max_header_bytes", gate.SETTINGS.max_header_bytes)
        gate.SETTINGS.body_timeout_s = ops.get("body_timeout_s", gate.SETTINGS.body_timeout_s)
        drain.STATE.timeout_s = ops.get("drain_timeout_s", drain.STATE.timeout_s)
        drain.STATE.abort_grace_s = ops.get("drain_abort_grace_s", drain.STATE.abort_grace_s)
        self.health_state = health.Health(health.app_name(), {m: f"Model_{m}" for m in models}, self.models,
                                          self.max_context)
        self.health_state.start()

    async def drain(self, timeout_s: float | None = None) -> dict:
        """Stop admitting, let in-flight requests finish, end the rest (`python -m serve_app.run` calls it)."""
        return await drain.STATE.drain(timeout_s)

    @api.get("/metrics")
    async def metrics(self, all: bool = False):
        """Prometheus text of every alive node: the serving series (`ray_gemma4_*`, `ray_serve_*`), or with
        `?all=true` everything Ray's metrics agents export (serve_app/ops/metrics.py)."""
        from fastapi.responses import PlainTextResponse

        text = await prometheus_text(everything=all)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    def _card(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "gemma4-inf2",
                "max_model_len": self.max_context.get(name)}

    @api.get("/v1/models")
    async def list_models(self):
        return {"object": "list", "data": [self._card(name) for name in self.models]}

    @api.get("/v1/models/{model:path}")
    async def get_model(self, model: str):
        if model not in self.models:
            return error(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
        return self._card(model)

    @api.get("/health")
    @api.get("/health/ready")
    async def health(self):
        """Ready while every model has a RUNNING replica, however busy (cached: serve_app/ops/health.py)."""
        status, body = await self.health_state.answer(drain.STATE.draining)
        return JSONResponse(body, status_code=status)

    @api.get("/health/live")
    async def live(self):
        self.health_state.start()
        return {"status": "draining" if drain.STATE.draining else "alive"}

    @api.post("/v1/chat/completions", openapi_extra=bodies.openapi(P.ChatRequest))
    async def chat(self, request: Request):
        return await self._serve(await bodies.parse(P.ChatRequest, await request.body()), chat=True)

    @api.post("/v1/completions", openapi_extra=bodies.openapi(P.CompletionRequest))
    async def completions(self, request: Request):
        return await self._serve(await bodies.parse(P.CompletionRequest, await request.body()), chat=False)

    async def _serve(self, body, chat: bool):
        handle = self.models.get(body.model)
        if handle is None:
            return error(404, f"The model `{body.model}` does not exist.", param="model", code="model_not_found")
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        out = Output(body, rid, chat)
        if not body.stream:
            return await self._complete(handle.complete.remote(body.payload()), body.model, chat, out)
        gen = handle.options(stream=True).generate.remote(body.payload())
        try:
            first = await gen.__anext__()
        except asyncio.CancelledError:  # the client left while the request waited: stop it
            gen.cancel()
            raise
        except BackPressureError:
            return overloaded(body.model)
        except REPLICA_GONE as e:
            return replica_gone(body.model, e)
        if isinstance(first, Failed):
            return failed(first, chat)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(self._stream(first, gen, rid, body.model, chat, include_usage, out),
                                 media_type="text/event-stream")

    async def _complete(self, response, model, chat, out: Output):
        try:
            ev = await response
        except asyncio.CancelledError:  # the client went away: stop the replica's generation
            log.info("client disconnected: request to %s cancelled", model)
            response.cancel()
            raise
        except BackPressureError:
            return overloaded(model)
        except REPLICA_GONE as e:
            return replica_gone(model, e)
        return failed(ev, chat) if isinstance(ev, Failed) else out.result(ev)

    async def _stream(self, first, gen, rid, model, chat, include_usage, out: Output):
        """SSE chunks. Any failure after the 200 went out is one `data: {"error": ...}` event and then
        `data: [DONE]`: a stream never just stops."""
        try:
            for chunk in out.start():
                yield sse(chunk)
            ev = first
            while ev is not None:
                if isinstance(ev, Delta):
                    for chunk in out.delta(ev):
                        yield sse(chunk)
                elif isinstance(ev, Finished):
                    for chunk in out.delta(Delta(ev.text, (), ev.logprobs)) + out.finish(ev):
                        yield sse(chunk)
                    if include_usage:
                        yield sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                                   "model": model, "choices": [],
                                   "usage": P.usage(ev.prompt_tokens, ev.completion_tokens)})
                    break
                elif isinstance(ev, Failed):
                    yield sse(P.error_body(ev.message, ev.type, ev.param, ev.code))
                    break
                ev = await anext(gen, None)
        except asyncio.CancelledError:  # the client went away: stop the replica's generation
            log.info("client disconnected: stream %s cancelled", rid)
            gen.cancel()
            raise
        except REPLICA_GONE as e:
            log.warning("replica of %s died mid-stream: %s", model, e)
            yield sse(P.error_body(f"the replica serving `{model}` stopped; retry the request", "server_error",
                                   code="replica_unavailable"))
        except Exception as e:  # ours, never the user's: log it, tell the client in shape
            log.exception("stream failed: %s", e)
            yield sse(P.error_body(f"internal error: {type(e).__name__}", "server_error", code="internal_error"))
        yield sse("[DONE]")
