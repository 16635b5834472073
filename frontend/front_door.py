"""The listener's request handler: a plain invoke goes straight to the dispatcher; every other
request goes through the app (its router, middlewares and routes).

An invoke is the hot path of a function service, and for it aiohttp's router, the match info, the
middleware chain (aiohttp's own `current_app` wrapper, then fnstream's error, CORS and auth
middlewares) cost more than fnstream's whole runtime, and each open stream held their frames. The
fast lane answers exactly what the app would for the requests it takes
(`tests/frontend/test_front_door.py` holds the two to the same answers): the same steps in the same
order, with the same helpers — the trace id (frontend/tracing.py), the token check
(frontend/auth.py `authenticate`), `Dispatcher.find` (404/403), the body (frontend/body.py),
`Dispatcher.dispatch`, the invoke route's JSON answer or event stream (frontend/routes/invoke.py),
JSON errors (frontend/errors.py), and the ending of an invoke route (as frontend/respond.py's:
cancelled when its client leaves, counted by frontend/metrics_counters.py).

It takes only what it fully understands: `POST /serverless/v1/functions/{ref}/invocations` with no
percent-escape in the path, a body already whole and not compressed, an Accept that gets JSON or
SSE, a Host that frontend/hosts.py allows (the app answers the 421), and no `Origin` (CORS),
`Expect`, `X-Invoke-Type` (jobs) or `X-Instance-Session` header.
Anything else — the short route, a browser's request, a body still arriving — takes the app path.
An app served by a plain `web.AppRunner` has no fast lane and answers the same.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from time import monotonic

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import istr

from runtime.dispatch import InvokeOptions
from runtime.errors import BadRequestError, FunctionServiceError, NotAcceptableError
from runtime.logs import set_log_context
from runtime.plain import PlainCall
from runtime.principal import Principal
from runtime.surface import InvocationSurface, Mode

from .auth import authenticate
from .body import arrived_body, max_body_bytes, parse_json_body, read_body
from .errors import error_response
from .hosts import HOST_POLICY
from .keys import CONFIG, DISPATCHER, OUTPUTS, TRACE_ID
from .metrics_counters import CLIENT_GONE, DISCONNECTED, INVOCATION, METRICS, count_answered, count_refused
from .respond import client_left
from .routes.invoke import json_answer, negotiate_mode, stream_response
from .tracing import TRACE_FLAGS, add_trace_headers, incoming_trace

__all__ = ("FrontDoor",)

log = logging.getLogger("fnstream.frontend")

_PREFIX = "/serverless/v1/functions/"
_SUFFIX = "/invocations"
# Headers that ask for more than a plain invoke: the app path answers them (case-insensitive keys made once).
_APP_PATH_HEADERS = tuple(istr(name) for name in ("Origin", "Expect", "X-Invoke-Type", "X-Instance-Session",
                                                  "Content-Encoding"))
_ACCEPT = istr("Accept")
_TRANSFER_ENCODING = istr("Transfer-Encoding")
# What no function reference holds, but the router reads otherwise (a path segment, an escape, a fragment).
_PLAIN_REF = frozenset("/%#{}")


class FrontDoor:
    """`handler(request)` of the listener (frontend/server.py): the fast lane, or the app."""

    __slots__ = ("_app_handler", "_body_limit", "_dispatcher", "_enable_event", "_executor", "_heartbeat", "_hosts",
                 "_outputs", "_stats", "_tokens")

    def __init__(self, app: web.Application, app_handler: Handler) -> None:
        config = app[CONFIG]
        self._app_handler = app_handler
        self._dispatcher = app[DISPATCHER]
        self._executor = self._dispatcher.executor
        self._tokens = config.auth.tokens
        self._enable_event = config.frontend.args.enableEvent
        self._heartbeat = config.frontend.args.heartbeatSeconds
        self._body_limit = max_body_bytes(app)
        self._stats = app.get(METRICS)  # None with metrics.enabled: false
        self._outputs = app[OUTPUTS]  # kept SSE output (runtime/durable.py)
        hosts = app[HOST_POLICY]
        self._hosts = None if hosts.any else hosts  # a Host not allowed: the app's host guard answers 421

    def __call__(self, request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        # Not a coroutine itself: a request for the app goes on with no frame of ours around it
        # (every open SSE stream would hold one).
        coding = request.headers.get(_TRANSFER_ENCODING)
        if coding is not None and coding.strip().lower() != "chunked":
            return self._refuse_coding(request, coding)
        lane = self._lane(request)
        if lane is None:
            return self._app_handler(request)  # type: ignore[arg-type]  # the app makes web.Requests
        return self._invoke(request, *lane)

    async def _refuse_coding(self, request: web.BaseRequest, coding: str) -> web.StreamResponse:
        """400 for a transfer coding other than plain `chunked` (aiohttp read `gzip, chunked` as
        chunked and ignored the gzip): the body would not be what the client sent."""
        request[TRACE_ID], request[TRACE_FLAGS] = incoming_trace(request.headers)
        response = error_response(request, BadRequestError(
            f"Transfer-Encoding {coding[:100]!r} is not supported: only 'chunked'"))
        add_trace_headers(request, response)
        response.force_close()  # where this body ends is not known
        return response

    def _lane(self, request: web.BaseRequest) -> tuple[str, Mode] | None:
        """The function `request` names and how the fast lane answers it ('json' or 'sse'); None
        for a request of the app's."""
        if request.method != "POST":
            return None
        path = request.raw_path
        if not path.startswith(_PREFIX):
            return None
        path = path.partition("?")[0]
        if not path.endswith(_SUFFIX):
            return None
        ref = path[len(_PREFIX):-len(_SUFFIX)]
        if not ref or not _PLAIN_REF.isdisjoint(ref):  # escapes, fragments, templates: the router's to read
            return None
        headers = request.headers
        for name in _APP_PATH_HEADERS:
            if name in headers:
                return None
        if not request.content.is_eof():
            return None
        if self._hosts is not None and not self._hosts.allows(request):
            return None
        try:
            return ref, negotiate_mode(headers.get(_ACCEPT), self._enable_event)
        except NotAcceptableError:
            return None  # the app answers the 406

    async def _invoke(self, request: web.BaseRequest, ref: str, mode: Mode) -> web.StreamResponse:
        """The invoke route's call, with the middlewares' work and the route's ending
        (frontend/respond.py's, written out here: an open stream holds this one frame, not one more)."""
        started = monotonic()
        trace_id, flags = incoming_trace(request.headers)
        request[TRACE_ID] = trace_id
        set_log_context(trace_id)  # as trace_id_of does: this task's log records name the trace
        spec = None
        inv: InvocationSurface | PlainCall | None = None
        try:
            principal = None
            if self._tokens:
                token = authenticate(request, self._tokens, "user")
                principal = Principal(token.tenant, token.role)
            dispatcher = self._dispatcher
            function = dispatcher.find(principal, ref)
            raw = arrived_body(request, self._body_limit)
            event = parse_json_body(raw if raw is not None else await read_body(request, self._body_limit))
            del raw  # (not held while a stream stays open)
            spec = function.spec  # from here on the invocation is counted
            call = dispatcher.plain(principal, function, event, trace_id) if mode == "json" else None
            if call is not None:  # a plain call (runtime/plain.py): in this task, its result encoded once
                inv = call
                answer = json_answer(call, await self._executor.call_plain(call), flags)
                if self._stats is not None:
                    self._stats.record(spec, 0, monotonic() - started, None, 0, call.id)
                return answer
            inv = await dispatcher.dispatch(principal, function, event, InvokeOptions(mode, trace_id, True))
            if inv.streaming:  # the invoke route's answer
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
        except FunctionServiceError as exc:
            count_refused(self._stats, request, exc.code, started, spec, inv)
            request[TRACE_FLAGS] = flags
            response = error_response(request, exc)
            if inv is not None:  # (the app path's error_response finds it in request[INVOCATION])
                response.headers["X-Invocation-Id"] = inv.id
            add_trace_headers(request, response)
        except ConnectionError as exc:  # a stream's write failed: the client left
            if inv is None or isinstance(inv, PlainCall):
                raise
            self._outputs.client_left(inv, CLIENT_GONE)
            log.info("client of invocation %s of %s left: %s", inv.id, inv.spec.name, exc)
            response = client_left()
            count_refused(self._stats, request, DISCONNECTED, started, spec, inv)
        return response
