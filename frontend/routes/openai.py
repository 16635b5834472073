"""OpenAI-compatible routes served by an ordinary deployed function (by default `chat`).

`POST /v1/chat/completions` and `POST /v1/completions` invoke the function the `openai:` config
maps to the route, with a RunPod-style event `{"input": {"openai_route", "openai_input"}}`.
Each stream write of the function is one chunk object, sent as `data: {json}` and a blank line,
with no `id:` lines (openai-python #2722/#3833), then `data: [DONE]`; a function with
`rawStream: true` frames its own SSE and is passed through verbatim. `stream: false` answers
the single object the function wrote (or returned). Errors are `{"error": {...}}`: as the
response when nothing was sent yet, else as a last event before `data: [DONE]`.
A request goes to the function that declares its `model` (manifest `models` / `modelAliases`), else
to the mapped one. `GET /v1/models` lists the `models` and `modelAliases` the mapped functions and
every function that declares `models` serve, or a mapped function's own name when its `models` is
empty (in cluster mode also those of mapped functions this node knows from the cluster but cannot
load). A request naming an alias reaches the function with the model
the alias names.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from runtime.deployment import FunctionRef
from runtime.dispatch import InvokeOptions
from runtime.durable import DurableOutputs, Retained
from runtime.errors import (
    BadRequestError,
    ForbiddenError,
    FunctionNotFoundError,
    FunctionServiceError,
    ResponseTooLargeError,
)
from runtime.surface import InvocationSurface

from ..auth import principal_of
from ..body import read_json_body
from ..errors import openai_error_body
from ..keys import CONFIG, DISPATCHER, OUTPUTS, TRACE_ID
from ..metrics_counters import FUNCTION, INVOCATION
from ..respond import invocation_route
from ..sse import DONE_EVENT, EventStream, encode_event, frame_raw, relay

__all__ = ("routes", "CHAT_ROUTE", "COMPLETIONS_ROUTE", "serve_openai", "model_object")

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


@invocation_route  # frontend/respond.py: cancelled if the client leaves, counted once it ends
async def _serve(request: web.Request, route: str, function_name: str | None = None) -> web.StreamResponse:
    """`function_name`: [jobs hook] RunPod's `/v2/{function}/openai/v1/...` names the function itself."""
    body = await read_json_body(request)
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequestError(f"'stream' must be true or false (got {stream!r})")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("missing required parameter 'model' (a string)")
    dispatcher = request.app[DISPATCHER]
    principal = principal_of(request)
    function = _declaring(request, model) if function_name is None else None
    if function is None:
        try:
            function = dispatcher.find(principal, function_name or _function_names(request)[route])
        except FunctionNotFoundError as exc:
            if function_name is not None:
                raise
            setting = "chatFunction" if route == CHAT_ROUTE else "completionsFunction"
            raise FunctionNotFoundError(f"{exc.message}, the function of `openai.{setting}`; and no deployed "
                                        f"function declares model {model!r} (manifest `models:`)") from None
    request[FUNCTION] = function.spec
    served = function.spec.served_models()
    if function.spec.models and model not in served:
        return _model_not_found(model)
    if served.get(model, model) != model:  # a modelAlias: the function is asked for the model it names
        body = {**body, "model": served[model]}
    event = {"input": {"openai_route": route, "openai_input": body}}
    inv = await dispatcher.dispatch(principal, function, event,
                                    InvokeOptions(mode="sse", trace_id=request.get(TRACE_ID)))
    request[INVOCATION] = inv
    if stream:
        sse = EventStream(request, headers={"X-Trace-Id": inv.trace_id, "X-Invocation-Id": inv.id})
        heartbeat = request.app[CONFIG].frontend.args.heartbeatSeconds
        return await _stream(sse, inv, heartbeat, request.app.get(OUTPUTS))
    return await _whole(inv)


def _error_text(exc: FunctionServiceError) -> str:
    """An OpenAI error event's data (also what the kept output ends with: runtime/durable.py)."""
    return json.dumps(openai_error_body(exc.status, exc.message, exc.code), ensure_ascii=False, separators=(",", ":"))


async def _stream(stream: EventStream, inv: InvocationSurface, heartbeat: float,
                  outputs: DurableOutputs | None) -> web.StreamResponse:
    """Each write is one `data:` event, sent as soon as it is read; then `data: [DONE]`.

    Kept by its id as an invoke's SSE is (runtime/durable.py), in its own framing: chunk n is
    kept event n, replayed by the events route as the same `data:` bytes, without ids."""
    # No `id:` lines on OpenAI routes: after an id, openai-python mis-parses comment heartbeats.
    kept = outputs.open(inv, _error_text) if outputs is not None else None
    tee = outputs.tee(kept) if outputs is not None and kept is not None else None
    await relay(stream, inv.channel, heartbeat, frame_raw if inv.mode == "raw" else _frame_chunks, tee)
    return await _finish(stream, inv, outputs, kept)


def _frame_chunks(batch: list[str]) -> bytes:
    return b"".join([encode_event(payload) for payload in batch])


async def _finish(stream: EventStream, inv: InvocationSurface, outputs: DurableOutputs | None,
                  kept: Retained | None) -> web.StreamResponse:
    """`data: [DONE]` after a clean end; after a failure, the error as a last event first."""
    try:
        await (inv.outcome() if outputs is None or kept is None else outputs.result(kept, inv))
    except FunctionServiceError as exc:
        if outputs is not None and kept is not None:
            await outputs.finish(kept, _error_text(exc))
        if not stream.prepared:
            raise  # nothing sent yet: a plain error response with the right status
        log.info("invocation %s of %s failed mid-stream: %s", inv.id, inv.spec.name, exc.message)
        await stream.write(encode_event(_error_text(exc)) + DONE_EVENT)
        return await stream.finish()
    if outputs is not None and kept is not None:
        await outputs.finish(kept, None)
    if inv.mode != "raw":
        await stream.write(DONE_EVENT)
    return await stream.finish()


async def _whole(inv: InvocationSurface) -> web.Response:
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
    headers = {"X-Trace-Id": inv.trace_id, "X-Invocation-Id": inv.id}
    answer = _single_object(inv, parts, result)
    if answer.get("error"):
        return web.json_response(answer, status=500, headers=headers)
    return web.json_response(answer, headers=headers, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _single_object(inv: InvocationSurface, parts: list[str], result: Any) -> dict[str, Any]:
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


serve_openai = _serve


@routes.post(CHAT_ROUTE)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, CHAT_ROUTE)


@routes.post(COMPLETIONS_ROUTE)
async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, COMPLETIONS_ROUTE)


def _declaring(request: web.Request, model: str) -> FunctionRef | None:
    """The function deployed here that declares `model` (manifest `models` / `modelAliases`), in the
    token's tenant: a function deployed with its models serves /v1 at once, no `openai.*Function`
    setting and no restart. The mapped function wins when it serves the model too."""
    found = _served_models(request).get(model)
    return found if found is not None and found.spec.models else None


def _served_models(request: web.Request) -> dict[str, FunctionRef]:
    """Model -> the mapped function serving it: deployed here or, in cluster mode, known to the cluster.
    Only the models the token may run: its own tenant's functions (every one when auth is off)."""
    models: dict[str, FunctionRef] = {}
    dispatcher = request.app[DISPATCHER]
    principal = principal_of(request)
    for name in dict.fromkeys(_function_names(request).values()):
        try:
            dep = dispatcher.find(principal, name)
        except (FunctionNotFoundError, ForbiddenError):  # another tenant's models are not listed
            continue
        for model in dep.spec.served_models():  # models, aliases; the function's name when models is empty
            models.setdefault(model, dep)
    tenant = None if principal is None else principal.tenant
    for dep in dispatcher.registry.list():  # then every function that declares its models
        if dep.spec.models and (tenant is None or dep.spec.tenant == tenant):
            for model in dep.spec.served_models():
                models.setdefault(model, dep)
    return models


def _model_object(model: str, dep: FunctionRef) -> dict[str, Any]:
    # `created` is when the model was made; fnstream does not know it, so 0.
    return {"id": model, "object": "model", "created": 0, "owned_by": dep.spec.tenant}


model_object = _model_object


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
