"""Invoke routes: JSON results, or live Server-Sent Events of every stream write.

`POST /serverless/v1/functions/{name-or-URN}/invocations` and the short route
`POST /invocations/{tenant}/{namespace}/{function[:version]}/`.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
from typing import Any

from aiohttp import web

from runtime.errors import (
    ForbiddenError,
    FunctionNotFoundError,
    FunctionServiceError,
    NotAcceptableError,
    ResponseTooLargeError,
    ResultNotSerializableError,
)
from runtime.invocation import Invocation
from runtime.manifest import function_urn
from runtime.registry import Deployment

from ..body import read_json_body
from ..cluster import CLUSTER
from ..keys import CONFIG, EXECUTOR, PRINCIPAL, REGISTRY, TRACE_ID
from ..negotiation import parse_accept, quality
from ..sse import DONE_EVENT, EventStream, encode_event, frame_raw, relay

__all__ = ("routes", "negotiate_mode", "run_invocation", "start_invocation", "encode_result", "find_function")

log = logging.getLogger("fnstream.frontend")
routes = web.RouteTableDef()


@functools.lru_cache(maxsize=256)  # clients send a handful of distinct Accept headers
def negotiate_mode(accept: str | None, enable_event: bool) -> str:
    """'sse' or 'json' from the Accept header.

    406 when only SSE is acceptable but disabled, or when JSON is refused outright (q=0) and SSE
    is not asked for; an Accept that merely lists other types still gets JSON (lenient).
    """
    ranges = parse_accept(accept)
    q_sse = quality(ranges, "text/event-stream", wildcards=False)
    q_json = quality(ranges, "application/json", unmentioned=-1.0)
    if q_sse > 0 and q_sse >= q_json:
        if enable_event:
            return "sse"
        if q_json > 0:
            return "json"
        raise NotAcceptableError("Server-Sent Events are disabled (set frontend.args.enableEvent: true); "
                                 "this request accepts only text/event-stream")
    if q_json == 0:
        raise NotAcceptableError("this request refuses application/json (q=0) and does not accept "
                                 "text/event-stream; those are the only answers")
    return "json"


def encode_result(value: Any, max_size: int) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        if not text.isascii():
            text.encode("utf-8")  # a lone surrogate has no UTF-8 form: refuse it here, not mid-response
    except (TypeError, ValueError) as exc:
        raise ResultNotSerializableError(f"the handler's result is not JSON-serializable: {exc}") from None
    if len(text) > max_size and len(text.encode()) > max_size:
        raise ResponseTooLargeError(f"the handler's result exceeds {max_size} bytes")
    return text


def _check_tenant(request: web.Request, dep: Deployment) -> None:
    if not request.app[CONFIG].auth.tokens:
        return  # auth off: no principal is set (and request.get would raise and catch KeyError)
    principal = request.get(PRINCIPAL)
    if principal is not None and principal.tenant != dep.spec.tenant:
        raise ForbiddenError(f"tenant {principal.tenant!r} may not invoke a function of tenant {dep.spec.tenant!r}")


async def start_invocation(request: web.Request, dep: Deployment, event: Any, mode: str, *,
                           inline: bool = False) -> Invocation:
    """Start `dep` here (`inline`: see Executor.start), or in cluster mode queue it for a worker when
    this node should not run it; either way with the Invocation surface (`channel`, `outcome()`, `cancel()`)."""
    app = request.app
    args = app[CONFIG].frontend.args
    cluster = app.get(CLUSTER)
    if cluster is not None and cluster.should_enqueue(dep):
        return await cluster.submit(dep, event, mode=mode, buffer_events=args.streamBufferEvents,
                                    max_write_size=args.maxWriteSize, max_response_size=args.maxResponseSize,
                                    trace_id=request.get(TRACE_ID))
    inv = Invocation(dep, event, mode=mode, loop=asyncio.get_running_loop(),
                     buffer_events=args.streamBufferEvents, max_write_size=args.maxWriteSize,
                     max_response_size=args.maxResponseSize, trace_id=request.get(TRACE_ID),
                     buffer_bytes=args.streamBufferBytes)
    app[EXECUTOR].start(inv, inline=inline)
    return inv


async def run_invocation(request: web.Request, dep: Deployment, event: Any) -> web.StreamResponse:
    """Invoke `dep` with `event` and answer as the request's Accept header asks."""
    args = request.app[CONFIG].frontend.args
    mode = negotiate_mode(request.headers.get("Accept"), args.enableEvent)
    inv = await start_invocation(request, dep, event, mode, inline=True)
    try:
        if inv.streaming:
            return await _stream_response(request, inv, args.heartbeatSeconds)
        return await _json_response(inv)
    except asyncio.CancelledError:
        inv.cancel("client disconnected")
        raise
    except ConnectionError as exc:
        if isinstance(exc, FunctionServiceError):
            raise
        # The client left while we wrote: stop the function and end quietly (not a server error).
        inv.cancel("client disconnected")
        log.info("client of invocation %s of %s left: %s", inv.id, inv.spec.name, exc)
        return web.Response(status=499)


async def _json_response(inv: Invocation) -> web.Response:
    result = await inv.outcome()
    if inv.deployment.kind in ("gen", "asyncgen") and result is None:
        result = inv.aggregate
    body = encode_result(result, inv.max_response_size)
    return web.Response(text=body, content_type="application/json", headers=_success_headers(inv))


def _success_headers(inv: Invocation) -> dict[str, str]:
    billing_ms = int((time.monotonic() - inv.started) * 1000)
    return {"X-Inner-Code": "0", "X-Trace-Id": inv.trace_id, "X-Billing-Duration": str(billing_ms)}


async def _stream_response(request: web.Request, inv: Invocation, heartbeat: float) -> web.StreamResponse:
    stream = EventStream(request, headers={"X-Trace-Id": inv.trace_id})
    raw = inv.mode == "raw"
    ids = itertools.count(1)

    def frame_with_ids(batch: list[str]) -> bytes:
        return b"".join([encode_event(payload, next(ids)) for payload in batch])

    await relay(stream, inv.channel, heartbeat, frame_raw if raw else frame_with_ids)
    next_id = next(ids)
    try:
        result = await inv.outcome()
        if not raw and result is not None:
            await stream.write(encode_event(encode_result(result, inv.max_response_size), next_id))
    except FunctionServiceError as exc:
        log.info("invocation %s of %s failed after %d events: %s", inv.id, inv.spec.name, next_id - 1, exc.message)
        if not stream.prepared:
            stream.set_status(exc.status)
            stream.response.headers["X-Inner-Code"] = str(exc.code)
        error = json.dumps(exc.to_dict(), ensure_ascii=False, separators=(",", ":"))
        await stream.write(encode_event(error, None if raw else next_id))
    if not raw:
        await stream.write(DONE_EVENT)
    return await stream.finish()


def find_function(app: web.Application, ref: str) -> Deployment:
    """The local deployment, or in cluster mode one known to the cluster but not loadable here."""
    try:
        return app[REGISTRY].get(ref)
    except FunctionNotFoundError:
        cluster = app.get(CLUSTER)
        if cluster is None:
            raise
        return cluster.lookup(ref)


@routes.post("/serverless/v1/functions/{ref}/invocations")
async def invoke(request: web.Request) -> web.StreamResponse:
    dep = find_function(request.app, request.match_info["ref"])
    _check_tenant(request, dep)
    event = await read_json_body(request)
    return await run_invocation(request, dep, event)


@routes.post("/invocations/{tenant}/{namespace}/{function}/")
async def invoke_short(request: web.Request) -> web.StreamResponse:
    name, _, version = request.match_info["function"].partition(":")
    urn = function_urn(request.match_info["tenant"], request.match_info["namespace"], name, version or "latest")
    dep = find_function(request.app, urn)
    _check_tenant(request, dep)
    event = await read_json_body(request)
    return await run_invocation(request, dep, event)
