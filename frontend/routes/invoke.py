"""Invoke routes: JSON results, or live Server-Sent Events of every stream write.

`POST /serverless/v1/functions/{name-or-URN}/invocations` and the short route
`POST /invocations/{tenant}/{namespace}/{function[:version]}/`. With `X-Invoke-Type: async`
(openYuanrong) the invocation runs as a background job instead: 202 `{"requestId"}` (routes/jobs.py).

An invoke has two doors and one body, `Invoker.serve`: the route here (after the app's router and
middlewares: every browser's request, the short route, a body still arriving) and the listener's
fast lane (frontend/front_door.py: plain invokes), which build_app hands the same `serve`. It is
the invoke from the function's lookup to the answer, and its ending: the invocation cancelled when
its client leaves, counted (frontend/metrics_counters.py) once it answered, failed or lost its
client, a refusal answered as JSON with the trace headers (frontend/errors.py). One coroutine from
the door to the answer: each level of await costs every request CPU and every open stream memory.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from time import monotonic
from typing import cast

from aiohttp import web
from multidict import istr

from runtime.dispatch import InvokeOptions
from runtime.durable import DurableOutputs, error_text
from runtime.errors import BadRequestError, FunctionServiceError
from runtime.manifest import function_urn
from runtime.plain import PlainCall
from runtime.principal import Principal
from runtime.sessions import SessionRequest, parse_session_header
from runtime.surface import InvocationInfo, InvocationSurface, Mode

from ..auth import principal_of
from ..body import arrived_body, max_body_bytes, max_body_values, parse_json_body, read_body
from ..errors import traced_error_response
from ..keys import CONFIG, DISPATCHER, OUTPUTS, TRACE_ID
from ..metrics_counters import CLIENT_GONE, DISCONNECTED, INVOCATION, METRICS, count_answered, count_refused
from ..negotiation import negotiate_mode
from ..respond import client_left
from ..sse import DONE_EVENT, EventStream, encode_event, frame_raw, relay
from ..tracing import TRACE_FLAGS, answer_trace_headers
from .jobs import submit_async

__all__ = ("routes", "Invoker", "INVOKER", "json_answer", "stream_response")

log = logging.getLogger("fnstream.frontend")
routes = web.RouteTableDef()
_INVOKE_TYPE, _SESSION, _ACCEPT = (istr(name) for name in ("X-Invoke-Type", "X-Instance-Session", "Accept"))


class Invoker:
    """The invoke of one app, behind both doors (built by build_app once its metrics are installed)."""

    __slots__ = ("_body_limit", "_dispatcher", "_enable_event", "_executor", "_heartbeat", "_outputs", "_stats",
                 "_values")

    def __init__(self, app: web.Application) -> None:
        args = app[CONFIG].frontend.args
        self._dispatcher = app[DISPATCHER]
        self._executor = self._dispatcher.executor
        self._enable_event = args.enableEvent
        self._heartbeat = args.heartbeatSeconds
        self._body_limit = max_body_bytes(app)
        self._values = max_body_values(app)
        self._stats = app.get(METRICS)  # None with metrics.enabled: false
        self._outputs = app[OUTPUTS]  # kept SSE output (runtime/durable.py)

    async def serve(self, request: web.BaseRequest, ref: str, mode: Mode | None, principal: Principal | None,
                    trace_id: str, flags: str) -> web.StreamResponse:
        """Invoke the function `ref` names for `principal` with the request's body, and answer
        in `mode` ('json' or 'sse'); its trace is `trace_id` and its answer's traceparent has
        `flags` (frontend/tracing.py). Mode None: a request of the app path, which may also ask
        for a job (`X-Invoke-Type: async`) or a session turn (`X-Instance-Session`), and whose
        Accept is read once its function and body were (404 and 400 before a 406)."""
        started = monotonic()
        spec = None
        inv: InvocationSurface | PlainCall | None = None
        try:
            dispatcher = self._dispatcher
            function = dispatcher.find(principal, ref)  # 404/403 before the body is read
            raw = arrived_body(request, self._body_limit)
            event = parse_json_body(raw if raw is not None else await read_body(request, self._body_limit),
                                    self._values)
            del raw  # (not held while a stream stays open)
            session = None
            if mode is None:  # the app path's: what the fast lane leaves to it
                headers = request.headers
                invoke_type = headers.get(_INVOKE_TYPE)
                if invoke_type and invoke_type.strip().lower() == "async":  # [jobs] openYuanrong async
                    if _SESSION in headers:  # a job runs later, outside any session: not silently dropped
                        raise BadRequestError("header X-Instance-Session cannot be used with X-Invoke-Type: "
                                              "async (a background job runs outside any session)")
                    return await submit_async(cast(web.Request, request), principal, function, event)
                mode = negotiate_mode(headers.get(_ACCEPT), self._enable_event)
                session = _session_of(request)
            spec = function.spec  # from here on the invocation is counted
            call = dispatcher.plain(principal, function, event, trace_id) if mode == "json" and session is None \
                else None
            if call is not None:  # a plain call (runtime/plain.py): in this task, its result encoded once
                inv = call
                answer = json_answer(call, await self._executor.call_plain(call), flags)
                if self._stats is not None:
                    self._stats.record(spec, 0, monotonic() - started, None, 0, call.id)
                return answer
            inv = await dispatcher.dispatch(principal, function, event, InvokeOptions(mode, trace_id, True, session))
            if inv.streaming:
                request[INVOCATION] = inv
                request[TRACE_FLAGS] = flags  # the stream sets its trace headers as it starts
                response = await stream_response(request, inv, self._heartbeat, self._outputs)
                count_answered(self._stats, request, response, started)
            else:
                response = json_answer(inv, await inv.encoded_result(), flags)
                if self._stats is not None:
                    self._stats.record(spec, 0, monotonic() - started, None, 0, inv.id)
        except asyncio.CancelledError:  # the client left
            if isinstance(inv, PlainCall):
                inv.cancel(CLIENT_GONE)  # (its handler ran in this task: cancelled with it)
            elif inv is not None:
                self._outputs.client_left(inv, CLIENT_GONE)  # cancelled, or (onDisconnect: continue) not
            count_refused(self._stats, request, DISCONNECTED, started, spec, inv)
            raise
        except FunctionServiceError as exc:  # StreamClosedError & co. are the function's outcome, not
            count_refused(self._stats, request, exc.code, started, spec, inv)  # the client leaving
            response = traced_error_response(request, exc, flags)
            if inv is not None:
                response.headers["X-Invocation-Id"] = inv.id
        except ConnectionError as exc:  # a stream's write failed: the client left
            if inv is None or isinstance(inv, PlainCall):
                raise
            self._outputs.client_left(inv, CLIENT_GONE)
            log.info("client of invocation %s of %s left: %s", inv.id, inv.spec.name, exc)
            response = client_left()
            count_refused(self._stats, request, DISCONNECTED, started, spec, inv)
        return response


INVOKER = web.AppKey("invoker", Invoker)


@routes.post("/serverless/v1/functions/{ref}/invocations")
@routes.post("/invocations/{tenant}/{namespace}/{function}/")
async def invoke(request: web.Request) -> web.StreamResponse:
    """Invoke the function the path names with the request's body and answer as its Accept header
    asks: the app path's door to `Invoker.serve` (its trace and principal the middlewares')."""
    return await request.app[INVOKER].serve(request, _ref_of(request.match_info), None, principal_of(request),
                                            request[TRACE_ID], request[TRACE_FLAGS])


def _ref_of(match: Mapping[str, str]) -> str:
    """The function the path names: `{ref}` (a name or URN), or the short route's tenant/namespace/function."""
    ref = match.get("ref")
    if ref is not None:
        return ref
    name, _, version = match["function"].partition(":")
    return function_urn(match["tenant"], match["namespace"], name, version or "latest")


def _session_of(request: web.BaseRequest) -> SessionRequest | None:
    """The X-Instance-Session the request names (400 if malformed), or None."""
    value = request.headers.get(_SESSION)
    return None if value is None else parse_session_header(value)


def json_answer(inv: InvocationInfo, result: str | None, trace_flags: str) -> web.Response:
    """The answer of a plain JSON call that returned `result` (its JSON text; a plain JSON call
    always has an answer, `null` for none), with its trace headers (`trace_flags`: frontend/tracing.py)."""
    headers = answer_trace_headers(inv.trace_id, trace_flags)
    headers[_CONTENT_TYPE] = _JSON_TYPE
    headers[_INVOCATION_ID] = inv.id
    headers[_INNER_CODE] = "0"
    headers[_BILLING] = str(int((monotonic() - inv.started) * 1000))
    # Bytes and a ready Content-Type: what `text=..., content_type=...` would give, without
    # aiohttp parsing the content type back to find the charset on every answer.
    return web.Response(body=(result or "null").encode(), headers=headers)


_JSON_TYPE = "application/json; charset=utf-8"
# The answer's header names as case-insensitive keys made once (the answer's CIMultiDict takes them as they are).
_CONTENT_TYPE, _INVOCATION_ID, _INNER_CODE, _BILLING = (
    istr(name) for name in ("Content-Type", "X-Invocation-Id", "X-Inner-Code", "X-Billing-Duration"))


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
