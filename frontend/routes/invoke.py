"""Invoke routes: JSON results, or live Server-Sent Events of every stream write.

`POST /serverless/v1/functions/{name-or-URN}/invocations` and the short route
`POST /invocations/{tenant}/{namespace}/{function[:version]}/`. With `X-Invoke-Type: async`
(openYuanrong) the invocation runs as a background job instead: 202 `{"requestId"}` (routes/jobs.py).
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping

from aiohttp import web
from multidict import istr

from runtime.dispatch import InvokeOptions
from runtime.durable import DurableOutputs, error_text
from runtime.errors import BadRequestError, FunctionServiceError, NotAcceptableError
from runtime.manifest import function_urn
from runtime.sessions import SessionRequest, parse_session_header
from runtime.surface import InvocationInfo, InvocationSurface, Mode

from ..auth import principal_of
from ..body import read_json_body
from ..keys import CONFIG, DISPATCHER, EXECUTOR, OUTPUTS, TRACE_ID
from ..metrics_counters import FUNCTION, INVOCATION
from ..negotiation import parse_accept, quality
from ..respond import invocation_route
from ..sse import DONE_EVENT, EventStream, encode_event, frame_raw, relay
from ..tracing import answer_trace_headers
from .jobs import submit_async

__all__ = ("routes", "negotiate_mode", "json_answer", "stream_response")

log = logging.getLogger("fnstream.frontend")
routes = web.RouteTableDef()


@functools.lru_cache(maxsize=256)  # clients send a handful of distinct Accept headers
def negotiate_mode(accept: str | None, enable_event: bool) -> Mode:
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


@routes.post("/serverless/v1/functions/{ref}/invocations")
@routes.post("/invocations/{tenant}/{namespace}/{function}/")
@invocation_route  # frontend/respond.py: cancelled if the client leaves, counted once it ends
async def invoke(request: web.Request) -> web.StreamResponse:
    """Invoke the function the path names with the request's body and answer as its Accept header asks.

    One coroutine from the route to the answer (its ending's wrapper aside): each level of await
    costs every request CPU and every open stream memory."""
    app = request.app  # a property chain: looked up once
    principal = principal_of(request)
    dispatcher = app[DISPATCHER]
    function = dispatcher.find(principal, _ref_of(request.match_info))  # 404/403 before the body is read
    event = await read_json_body(request)
    headers = request.headers
    invoke_type = headers.get("X-Invoke-Type")
    if invoke_type and invoke_type.strip().lower() == "async":  # [jobs] openYuanrong async
        if "X-Instance-Session" in headers:  # a job runs later, outside any session: not silently dropped
            raise BadRequestError("header X-Instance-Session cannot be used with X-Invoke-Type: async "
                                  "(a background job runs outside any session)")
        return await submit_async(request, principal, function, event)
    args = app[CONFIG].frontend.args
    mode = negotiate_mode(headers.get("Accept"), args.enableEvent)
    session = _session_of(request)
    request[FUNCTION] = function.spec  # from here on the invocation is counted
    if mode == "json" and session is None:
        call = dispatcher.plain(principal, function, event, request[TRACE_ID])
        if call is not None:  # a plain call (runtime/plain.py): in this task, its result encoded once
            request[INVOCATION] = call
            return json_answer(call, await app[EXECUTOR].call_plain(call))
    options = InvokeOptions(mode=mode, trace_id=request.get(TRACE_ID), inline=True, session=session)
    inv = await dispatcher.dispatch(principal, function, event, options)
    request[INVOCATION] = inv
    if inv.streaming:
        return await stream_response(request, inv, args.heartbeatSeconds, app[OUTPUTS])
    return await _json_response(inv)


def _ref_of(match: Mapping[str, str]) -> str:
    """The function the path names: `{ref}` (a name or URN), or the short route's tenant/namespace/function."""
    ref = match.get("ref")
    if ref is not None:
        return ref
    name, _, version = match["function"].partition(":")
    return function_urn(match["tenant"], match["namespace"], name, version or "latest")


def _session_of(request: web.Request) -> SessionRequest | None:
    """The X-Instance-Session the request names (400 if malformed), or None."""
    value = request.headers.get("X-Instance-Session")
    return None if value is None else parse_session_header(value)


async def _json_response(inv: InvocationSurface) -> web.Response:
    return json_answer(inv, await inv.encoded_result())


def json_answer(inv: InvocationInfo, result: str | None, trace_flags: str | None = None) -> web.Response:
    """The answer of a plain JSON call that returned `result` (its JSON text; a plain JSON call
    always has an answer, `null` for none). With `trace_flags` (frontend/front_door.py: no middleware
    follows it), the answer's trace headers are set here too."""
    headers = {_TRACE: inv.trace_id} if trace_flags is None else answer_trace_headers(inv.trace_id, trace_flags)
    headers[_CONTENT_TYPE] = _JSON_TYPE
    headers[_INVOCATION_ID] = inv.id
    headers[_INNER_CODE] = "0"
    headers[_BILLING] = str(int((time.monotonic() - inv.started) * 1000))
    # Bytes and a ready Content-Type: what `text=..., content_type=...` would give, without
    # aiohttp parsing the content type back to find the charset on every answer.
    return web.Response(body=(result or "null").encode(), headers=headers)


_JSON_TYPE = "application/json; charset=utf-8"
# The answer's header names as case-insensitive keys made once (the answer's CIMultiDict takes them as they are).
_TRACE, _CONTENT_TYPE, _INVOCATION_ID, _INNER_CODE, _BILLING = (
    istr(name) for name in ("X-Trace-Id", "Content-Type", "X-Invocation-Id", "X-Inner-Code", "X-Billing-Duration"))


async def stream_response(request: web.BaseRequest, inv: InvocationSurface, heartbeat: float,
                          outputs: DurableOutputs | None = None) -> web.StreamResponse:
    """The answer of an SSE (or raw) call: its writes as events, then its result, then [DONE].

    With `outputs` (the node's kept invocations, runtime/durable.py) an SSE answer is also kept,
    each batch before the client gets it, so a client that left can read it again."""
    stream = EventStream(request, headers={"X-Trace-Id": inv.trace_id, "X-Invocation-Id": inv.id})
    raw = inv.mode == "raw"
    kept = outputs.open(inv) if outputs is not None else None
    tee = outputs.tee(kept) if outputs is not None and kept is not None else None
    await relay(stream, inv.channel, heartbeat, frame_raw if raw else stream.frame_with_ids, tee)
    next_id = stream.next_id
    last: str | None = None
    try:
        last = await (inv.encoded_result() if outputs is None else outputs.result(kept, inv))
    except FunctionServiceError as exc:
        log.info("invocation %s of %s failed after %d events: %s", inv.id, inv.spec.name, next_id - 1, exc.message)
        if not stream.prepared:
            stream.set_status(exc.status)
            stream.response.headers["X-Inner-Code"] = str(exc.code)
        last = error_text(exc)
        if raw:
            await stream.write(encode_event(last))
            return await stream.finish()
    if outputs is not None and kept is not None:
        await outputs.finish(kept, last)
    if raw:
        return await stream.finish()
    await stream.write(DONE_EVENT if last is None else encode_event(last, next_id) + DONE_EVENT)
    return await stream.finish()
