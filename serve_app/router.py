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

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError

from serve_app.events import Delta, Failed, Finished
from serve_app.http import REPLICA_GONE, api, error, failed, log, overloaded, replica_gone, sse
from serve_app.openai import bodies
from serve_app.openai import protocol as P
from serve_app.openai import tokenize as TK
from serve_app.openai.responses import Output
from serve_app.ops import drain, gate, health
from serve_app.ops.metrics import prometheus_text


# Serve pickles this class when the decorator runs: every helper it uses is defined above or imported.
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

    @api.post("/tokenize", openapi_extra=bodies.openapi(TK.TokenizeRequest))
    async def tokenize(self, request: Request):
        body = await bodies.parse(TK.TokenizeRequest, await request.body())
        out = await self._call(body.model, "tokenize", body.call_args(), body.messages is not None)
        if isinstance(out, dict):
            out["max_model_len"] = self.max_context.get(body.model)
        return out

    @api.post("/detokenize", openapi_extra=bodies.openapi(TK.DetokenizeRequest))
    async def detokenize(self, request: Request):
        body = await bodies.parse(TK.DetokenizeRequest, await request.body())
        return await self._call(body.model, "detokenize", (list(body.tokens),), False)

    async def _call(self, model: str, name: str, args: tuple, chat: bool):
        """Tokenizer work on a replica of `model`: its answer, or the error it stands for."""
        handle = self.models.get(model)
        if handle is None:
            return error(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
        try:
            out = await handle.call.remote(name, args)
        except BackPressureError:
            return overloaded(model)
        except REPLICA_GONE as e:
            return replica_gone(model, e)
        return failed(out, chat) if isinstance(out, Failed) else out

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
        out.open(first)
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
