"""OpenAI-compatible routes served by an ordinary deployed function (by default `chat`).

`POST /v1/chat/completions` and `POST /v1/completions` invoke the function the `openai:` config
maps to the route, with a RunPod-style event `{"input": {"openai_route", "openai_input"}}`.
Each stream write of the function is one chunk object, sent as `data: {json}` and a blank line,
with no `id:` lines (openai-python #2722/#3833), then `data: [DONE]`; a function with
`rawStream: true` frames its own SSE and is passed through verbatim. `stream: false` answers
the single object the function wrote (or returned). Errors are `{"error": {...}}`: as the
response when nothing was sent yet, else as a last event before `data: [DONE]`.
`GET /v1/models` lists the `models` the mapped functions declare (in cluster mode also those of
mapped functions this node knows from the cluster but cannot load).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from runtime.errors import (BadRequestError, ForbiddenError, FunctionNotFoundError, FunctionServiceError,
                            ResponseTooLargeError)
from runtime.invocation import Invocation
from runtime.registry import Deployment

from ..body import read_json_body
from ..errors import openai_error_body
from ..keys import CONFIG, PRINCIPAL
from ..sse import DONE_EVENT, EventStream, encode_event, frame_raw, relay
from .invoke import find_function, start_invocation

__all__ = ("routes", "CHAT_ROUTE", "COMPLETIONS_ROUTE")

log = logging.getLogger("fnstream.frontend")
routes = web.RouteTableDef()

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"


def _function_names(request: web.Request) -> dict[str, str]:
    cfg = request.app[CONFIG].openai
    return {CHAT_ROUTE: cfg.chatFunction, COMPLETIONS_ROUTE: cfg.completionsFunction}


def _model_not_found(model: str) -> web.Response:
    body = openai_error_body(404, f"The model {model!r} does not exist or is not served here "
                                  "(see GET /v1/models)", "model_not_found")
    return web.json_response(body, status=404)


def _check_tenant(request: web.Request, dep: Deployment) -> None:
    principal = request.get(PRINCIPAL)
    if principal is not None and principal.tenant != dep.spec.tenant:
        raise ForbiddenError(f"tenant {principal.tenant!r} may not use function {dep.name!r} "
                             f"of tenant {dep.spec.tenant!r}")


async def _serve(request: web.Request, route: str) -> web.StreamResponse:
    body = await read_json_body(request)
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequestError(f"'stream' must be true or false (got {stream!r})")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("missing required parameter 'model' (a string)")
    dep = find_function(request.app, _function_names(request)[route])
    _check_tenant(request, dep)
    if dep.spec.models and model not in dep.spec.models:
        return _model_not_found(model)
    event = {"input": {"openai_route": route, "openai_input": body}}
    inv = await start_invocation(request, dep, event, "sse")   # here, or queued for a cluster worker
    try:
        if stream:
            return await _stream(request, inv, request.app[CONFIG].frontend.args.heartbeatSeconds)
        return await _whole(inv)
    except (asyncio.CancelledError, ConnectionError):
        inv.cancel("client disconnected")
        raise


def _error_event(exc: FunctionServiceError) -> bytes:
    body = openai_error_body(exc.status, exc.message, exc.code)
    return encode_event(json.dumps(body, ensure_ascii=False, separators=(",", ":")))


async def _stream(request: web.Request, inv: Invocation, heartbeat: float) -> web.StreamResponse:
    """Each write is one `data:` event, sent as soon as it is read; then `data: [DONE]`."""
    stream = EventStream(request, headers={"X-Trace-Id": inv.trace_id})
    try:
        await _relay(stream, inv, heartbeat)
        return await _finish(stream, inv)
    except ConnectionError as exc:
        if isinstance(exc, FunctionServiceError):
            raise
        # The client left while we wrote: stop the function, and end quietly (not a server error).
        inv.cancel("client disconnected")
        log.info("client of invocation %s of %s left: %s", inv.id, inv.spec.name, exc)
        return stream.response


async def _relay(stream: EventStream, inv: Invocation, heartbeat: float) -> None:
    # No `id:` lines on OpenAI routes: after an id, openai-python mis-parses comment heartbeats.
    await relay(stream, inv.channel, heartbeat, frame_raw if inv.mode == "raw" else _frame_chunks)


def _frame_chunks(batch: list[str]) -> bytes:
    return b"".join([encode_event(payload) for payload in batch])


async def _finish(stream: EventStream, inv: Invocation) -> web.StreamResponse:
    """`data: [DONE]` after a clean end; after a failure, the error as a last event first."""
    try:
        await inv.outcome()
    except FunctionServiceError as exc:
        if not stream.prepared:
            raise  # nothing sent yet: a plain error response with the right status
        log.info("invocation %s of %s failed mid-stream: %s", inv.id, inv.spec.name, exc.message)
        await stream.write(_error_event(exc) + DONE_EVENT)
        return await stream.finish()
    if inv.mode != "raw":
        await stream.write(DONE_EVENT)
    return await stream.finish()


async def _whole(inv: Invocation) -> web.Response:
    """The one object the function wrote (or returned) for `stream: false`, as the response."""
    parts: list[str] = []
    size = 0
    while batch := await inv.channel.get_batch():
        parts.extend(batch)
        size += sum(len(p) for p in batch)
        if size > inv.max_response_size:
            inv.cancel("answer too large")
            raise ResponseTooLargeError(f"the answer of {inv.spec.name!r} exceeds {inv.max_response_size} bytes")
    result = await inv.outcome()
    headers = {"X-Trace-Id": inv.trace_id}
    answer = _single_object(inv, parts, result)
    if answer.get("error"):
        return web.json_response(answer, status=500, headers=headers)
    return web.json_response(answer, headers=headers, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _single_object(inv: Invocation, parts: list[str], result: Any) -> dict:
    if not parts and isinstance(result, dict):
        return result
    try:
        answer = json.loads("".join(parts)) if parts else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise FunctionServiceError(f"function {inv.spec.name!r} did not answer one JSON object for a "
                                   f"request with stream false ({len(parts)} writes)", code=200502, status=502)
    return answer


@routes.post(CHAT_ROUTE)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, CHAT_ROUTE)


@routes.post(COMPLETIONS_ROUTE)
async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, COMPLETIONS_ROUTE)


def _served_models(request: web.Request) -> dict[str, Any]:
    """Model -> the mapped function serving it: deployed here or, in cluster mode, known to the cluster."""
    models: dict[str, Any] = {}
    for name in dict.fromkeys(_function_names(request).values()):
        try:
            dep = find_function(request.app, name)
        except FunctionNotFoundError:
            continue
        for model in dep.spec.models:
            models.setdefault(model, dep)
    return models


def _model_object(model: str, dep: Any) -> dict:
    # `created` is when the model was made; fnstream does not know it, so 0.
    return {"id": model, "object": "model", "created": 0, "owned_by": dep.spec.tenant}


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    models = _served_models(request)
    return web.json_response({"object": "list", "data": [_model_object(m, d) for m, d in models.items()]})


@routes.get("/v1/models/{model}")
async def get_model(request: web.Request) -> web.Response:
    model = request.match_info["model"]
    dep = _served_models(request).get(model)
    if dep is None:
        return _model_not_found(model)
    return web.json_response(_model_object(model, dep))
