"""Router: the HTTP ingress. Maps `model` to its deployment handle and speaks OpenAI's API (chat and
completions, `n` choices each its own engine sequence, streamed interleaved by `index`), the Responses API
(`/v1/responses`, stateless) and Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`, every error
in Anthropic's shape). All three become the same `events.GenerateRequest` (serve_app/openai/protocol.py,
responses_api.py, anthropic_api.py) and run through one path here (`_generate`: a writer per API shapes the
answer or the SSE events).

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
from serve_app.http import (
    REPLICA_GONE,
    answer,
    anthropic_error,
    api,
    as_anthropic,
    error,
    failed,
    log,
    overloaded,
    replica_gone,
)
from serve_app.openai import anthropic_api as AA
from serve_app.openai import bodies
from serve_app.openai import protocol as P
from serve_app.openai import responses_api as RA
from serve_app.openai import tokenize as TK
from serve_app.openai.responses import Choices
from serve_app.ops import drain, gate, health
from serve_app.ops.metrics import prometheus_text


def _cancel(calls) -> None:
    for c in calls:
        c.cancel()


async def _merged(firsts: list, gens: list):
    """(choice index, event) of every choice's stream until each has finished (or one failed), interleaved as they
    come; one choice is read directly, several through one task each."""
    if len(gens) == 1:
        ev = firsts[0]
        while ev is not None:
            yield 0, ev
            if isinstance(ev, (Finished, Failed)):
                return
            ev = await anext(gens[0], None)
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, ev, gen) -> None:
        try:
            while ev is not None:
                await queue.put((i, ev))
                if isinstance(ev, (Finished, Failed)):
                    return
                ev = await anext(gen, None)
            await queue.put((i, None))
        except Exception as e:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, f, g)) for i, (f, g) in enumerate(zip(firsts, gens))]
    try:
        left = len(gens)
        while left:
            i, ev = await queue.get()
            if isinstance(ev, BaseException):
                raise ev
            if ev is None:
                left -= 1
                continue
            yield i, ev
            if isinstance(ev, Finished):
                left -= 1
            elif isinstance(ev, Failed):
                return
    finally:
        for t in tasks:
            t.cancel()


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

    @api.post("/v1/responses")
    async def responses(self, request: Request):
        """The Responses API, stateless (serve_app/openai/responses_api.py)."""
        body = await bodies.parse(RA.ResponsesBody, await request.body())
        handle = self.models.get(body.model)
        if handle is None:
            return error(404, f"The model `{body.model}` does not exist.", param="model", code="model_not_found")
        return await self._generate(handle, body.model, body.payloads(), body.stream, RA.ResponsesWriter(body),
                                    lambda ev: failed(ev, True, "input"))

    @api.post("/v1/messages")
    async def messages(self, request: Request):
        """Anthropic's Messages API (serve_app/openai/anthropic_api.py); every error in Anthropic's shape."""
        try:
            body = await bodies.parse(AA.MessagesBody, await request.body())
            handle = self.models.get(body.model)
            if handle is None:
                return anthropic_error(404, f"model: `{body.model}` does not exist")
            out = await self._generate(handle, body.model, body.payloads(), body.stream, AA.MessagesWriter(body),
                                       lambda ev: failed(ev, True))
        except Exception as e:  # noqa: BLE001 - answered as the OpenAI routes would be, in Anthropic's shape
            out = await answer(request, e)
        return as_anthropic(out)

    @api.post("/v1/messages/count_tokens")
    async def count_tokens(self, request: Request):
        try:
            body = await bodies.parse(AA.CountTokensBody, await request.body())
            out = await self._call(body.model, "tokenize", (body.chat.payload(), True, True, False), True)
            if isinstance(out, dict):
                out = {"input_tokens": out["count"]}
        except Exception as e:  # noqa: BLE001
            out = await answer(request, e)
        return as_anthropic(out)

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
        writer = Choices(body, P.new_id("chatcmpl" if chat else "cmpl"), chat)
        return await self._generate(handle, body.model, body.payloads(), body.stream, writer,
                                    lambda ev: failed(ev, chat))

    async def _generate(self, handle, model: str, payloads: list, stream: bool, writer, refuse):
        """Run each payload (one engine sequence a choice) on a replica of `model`: the writer's `result` of
        their Finished events, or a stream of the writer's SSE lines; an error before anything was sent is a
        status code (`refuse` turns a replica's Failed into the API's response)."""
        if not stream:
            answer = await self._complete([handle.complete.remote(p) for p in payloads], model)
            if not isinstance(answer, list):
                return answer
            bad = next((ev for ev in answer if isinstance(ev, Failed)), None)
            return refuse(bad) if bad is not None else writer.result(answer)
        gens = [handle.options(stream=True).generate.remote(p) for p in payloads]
        firsts = []
        try:
            for gen in gens:
                firsts.append(await gen.__anext__())
        except asyncio.CancelledError:  # the client left while the request waited: stop it
            _cancel(gens)
            raise
        except BackPressureError:
            _cancel(gens)
            return overloaded(model)
        except REPLICA_GONE as e:
            _cancel(gens)
            return replica_gone(model, e)
        bad = next((ev for ev in firsts if isinstance(ev, Failed)), None)
        if bad is not None:
            _cancel(gens)
            return refuse(bad)
        return StreamingResponse(self._stream(firsts, gens, model, writer), media_type="text/event-stream")

    async def _complete(self, responses: list, model: str):
        try:  # one choice awaited as it is (a task per request would cost the router CPU for nothing)
            return [await responses[0]] if len(responses) == 1 else list(await asyncio.gather(*responses))
        except asyncio.CancelledError:  # the client went away: stop the replica's generation
            log.info("client disconnected: request to %s cancelled", model)
            _cancel(responses)
            raise
        except BackPressureError:
            _cancel(responses)
            return overloaded(model)
        except REPLICA_GONE as e:
            _cancel(responses)
            return replica_gone(model, e)

    async def _stream(self, firsts, gens, model, writer):
        """SSE lines. Any failure after the 200 went out is one error event and then the writer's end (OpenAI's
        `data: [DONE]`): a stream never just stops."""
        ended: set[int] = set()
        try:
            for line in writer.head(firsts):
                yield line
            async for i, ev in _merged(firsts, gens):
                if isinstance(ev, (Finished, Failed)):
                    ended.add(i)
                if isinstance(ev, Delta):
                    for line in writer.delta(i, ev):
                        yield line
                elif isinstance(ev, Finished):
                    for line in writer.finish(i, ev):
                        yield line
                elif isinstance(ev, Failed):
                    for line in writer.fail(ev.message, ev.type, ev.param, ev.code):
                        yield line
                    break
        except asyncio.CancelledError:  # the client went away: the replicas' generation stops (finally)
            log.info("client disconnected: stream to %s cancelled", model)
            raise
        except REPLICA_GONE as e:
            log.warning("replica of %s died mid-stream: %s", model, e)
            for line in writer.fail(f"the replica serving `{model}` stopped; retry the request", "server_error",
                                    code="replica_unavailable"):
                yield line
        except Exception as e:  # ours, never the user's: log it, tell the client in shape
            log.exception("stream failed: %s", e)
            for line in writer.fail(f"internal error: {type(e).__name__}", "server_error", code="internal_error"):
                yield line
        finally:
            if len(ended) < len(gens):  # stopped early (a choice failed, or the client left): stop the rest
                _cancel([g for i, g in enumerate(gens) if i not in ended])
        for line in writer.end():
            yield line

