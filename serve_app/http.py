"""The FastAPI app the router serves and its error envelope: the gate and drain middleware, OpenAI-shaped
errors for every failure (a bad field a 400 naming it, FastAPI's 422 mapped, a body that is not JSON, a
schema past its limits, an unknown route), and the answers for a full queue, a replica gone and a replica's
refusal; the same errors in Anthropic's shape for `/v1/messages` (`answer`, `as_anthropic`). Imported by
`serve_app.router`, whose routes it serves."""

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray.exceptions import ActorUnavailableError, RayActorError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.events import Failed
from serve_app.openai import bodies
from serve_app.openai import protocol as P
from serve_app.openai.constraints import ConstraintError
from serve_app.ops import drain, gate

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
    first = _telling(exc.errors())
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


def _telling(errors: list[dict]) -> dict:
    """The error to report: the first, unless it only says a union's first branch (`str`) did not match while
    another branch went deeper (a content part of an unknown type, or missing a field, says so)."""
    if not errors:
        return {}
    first = errors[0]
    loc = first.get("loc", ())
    if loc and loc[-1] in _TYPE_NAMES:
        deeper = [e for e in errors[1:] if len(e.get("loc", ())) > len(loc)]
        return deeper[0] if deeper else first
    return first


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


def failed(ev: Failed, chat: bool, messages: str = "messages") -> JSONResponse:
    """A replica's refusal as the HTTP error it stands for (a chat's prompt is its `messages`, or the field the
    API calls them)."""
    param = messages if chat and ev.param in ("prompt", "messages") else ev.param
    message = ev.message
    if param != ev.param:  # the replica's wording, in the API's own field name
        subject = "the messages have" if param == "messages" else f"the {param} has"
        message = message.replace("the messages have", subject).replace("the prompt has", subject)
    return error(ev.status, message, ev.type, param=param, code=ev.code)


def replica_gone(model: str, e: Exception) -> JSONResponse:
    log.warning("replica of %s unavailable: %s", model, e)
    return error(503, f"the replica serving `{model}` stopped; retry the request", "server_error",
                 code="replica_unavailable", headers=RETRY)


HANDLERS = ((RequestValidationError, _validation), (bodies.BodyError, _body), (ConstraintError, _constraint),
            (StarletteHTTPException, _http))


async def answer(request: Request, exc: Exception) -> JSONResponse:
    """The response the app's exception handlers give `exc` (for a route that reshapes its errors); a cancelled
    request is raised again."""
    if drain.cancelled(exc):
        raise exc
    for kind, handler in HANDLERS:
        if isinstance(exc, kind):
            return await handler(request, exc)
    return await _server_error(request, exc)


def anthropic_error(status: int, message: str, headers=None) -> JSONResponse:
    from serve_app.openai.anthropic_api import error_body

    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def as_anthropic(out):
    """An OpenAI-shaped error response in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`,
    the message naming the field); anything else as it is."""
    if not isinstance(out, JSONResponse) or out.status_code < 400:
        return out
    err = json.loads(out.body).get("error") or {}
    message, param = err.get("message", "error"), err.get("param")
    if param and not message.startswith(param):
        message = f"{param}: {message}"
    headers = {k: v for k, v in out.headers.items() if k.lower() == "retry-after"}
    return anthropic_error(out.status_code, message, headers or None)
