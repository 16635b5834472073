"""The listener's request handler: a plain invoke goes straight to the invoke; every other request
goes through the app (its router, middlewares and routes).

An invoke is the hot path of a function service, and for it aiohttp's router, the match info, the
middleware chain (aiohttp's own `current_app` wrapper, then fnstream's error, CORS and auth
middlewares) cost more than fnstream's whole runtime, and each open stream held their frames. The
fast lane does the middlewares' work for the requests it takes — the trace id (frontend/tracing.py),
the Host guard's check (frontend/hosts.py), the token check (frontend/auth.py `authenticate`, with
the role `required_role` names) — and calls the app's invoke: `Invoker.serve`
(frontend/routes/invoke.py), the one the invoke route calls too, which build_app hands this door
(`InvokeLane`; this module imports no route). `tests/frontend/test_front_door.py` holds the two
doors to the same answers.

It takes only what it fully understands: `POST /serverless/v1/functions/{ref}/invocations` with no
percent-escape in the path, a body already whole and not compressed, an Accept that gets JSON or
SSE, a Host that frontend/hosts.py allows (the app answers the 421), and no `Origin` (CORS),
`Expect`, `X-Invoke-Type` (jobs) or `X-Instance-Session` header.
Anything else — the short route, a browser's request, a body still arriving — takes the app path.
And it steps aside altogether when the app would answer differently: a middleware or an
`on_response_prepare` hook added after build_app (the lane runs neither), or `fast_lane=False`.
An app served by a plain `web.AppRunner` has no fast lane and answers the same.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import istr

from runtime.errors import BadRequestError, FunctionServiceError, NotAcceptableError
from runtime.logs import set_log_context
from runtime.principal import Principal
from runtime.surface import Mode

from .auth import authenticate, required_role
from .errors import error_response, traced_error_response
from .hosts import HOST_POLICY
from .keys import CONFIG, TRACE_ID
from .negotiation import negotiate_mode
from .tracing import TRACE_FLAGS, add_trace_headers, incoming_trace

__all__ = ("FrontDoor", "InvokeLane", "INVOKE_LANE", "Serve")

log = logging.getLogger("fnstream.frontend")

# The invoke both doors call (frontend/routes/invoke.py `Invoker.serve`):
# (request, ref, mode, principal, trace id, trace flags) -> its answer.
Serve = Callable[[web.BaseRequest, str, "Mode | None", "Principal | None", str, str], Awaitable[web.StreamResponse]]

_PREFIX = "/serverless/v1/functions/"
_SUFFIX = "/invocations"
# Headers that ask for more than a plain invoke: the app path answers them (case-insensitive keys made once).
_APP_PATH_HEADERS = tuple(istr(name) for name in ("Origin", "Expect", "X-Invoke-Type", "X-Instance-Session",
                                                  "Content-Encoding"))
_ACCEPT = istr("Accept")
_TRANSFER_ENCODING = istr("Transfer-Encoding")
# What no function reference holds, but the router reads otherwise (a path segment, an escape, a fragment).
_PLAIN_REF = frozenset("/%#{}")


class InvokeLane(NamedTuple):
    """What build_app hands the front door (`app[INVOKE_LANE]`): the app's invoke, and the
    middlewares and response-prepare hooks the app had then, which the lane does the work of
    (or, like CORS's, which do nothing for the requests it takes)."""

    serve: Serve
    middlewares: tuple[Any, ...]
    on_response_prepare: tuple[Any, ...]

    @classmethod
    def of(cls, app: web.Application, serve: Serve) -> InvokeLane:
        return cls(serve, tuple(app.middlewares), tuple(app.on_response_prepare))

    def unknown_in(self, app: web.Application) -> str | None:
        """What `app` has that the lane does not do (added since build_app), or None."""
        middlewares = [m for m in app.middlewares if m not in self.middlewares]
        hooks = [h for h in app.on_response_prepare if h not in self.on_response_prepare]
        if not middlewares and not hooks:
            return None
        return ", ".join([*(f"middleware {_name(m)}" for m in middlewares),
                          *(f"on_response_prepare hook {_name(h)}" for h in hooks)])


INVOKE_LANE = web.AppKey("invoke_lane", InvokeLane)


def _name(thing: object) -> str:
    return getattr(thing, "__qualname__", None) or repr(thing)


class FrontDoor:
    """`handler(request)` of the listener (frontend/server.py): the fast lane, or the app."""

    __slots__ = ("_app_handler", "_enable_event", "_hosts", "_serve", "_tokens")

    def __init__(self, app: web.Application, app_handler: Handler, fast_lane: bool = True) -> None:
        config = app[CONFIG]
        self._app_handler = app_handler
        lane = app.get(INVOKE_LANE) if fast_lane else None
        unknown = lane.unknown_in(app) if lane is not None else None
        if unknown is not None:
            log.info("the front door's fast lane is off: the app has %s (every request takes the app path)", unknown)
        self._serve = lane.serve if lane is not None and unknown is None else None  # None: no fast lane
        self._tokens = config.auth.tokens
        self._enable_event = config.frontend.args.enableEvent
        hosts = app[HOST_POLICY]
        self._hosts = None if hosts.any else hosts  # a Host not allowed: the app's host guard answers 421

    def __call__(self, request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        # Not a coroutine itself: a request for the app goes on with no frame of ours around it,
        # and one for the lane with only the invoke's (every open SSE stream would hold one more).
        coding = request.headers.get(_TRANSFER_ENCODING)
        if coding is not None and coding.strip().lower() != "chunked":
            return self._refuse_coding(request, coding)
        lane = self._lane(request)
        if lane is None:
            return self._app_handler(request)  # type: ignore[arg-type]  # the app makes web.Requests
        # The middlewares' work: the trace id (as trace_id_of does: this task's log records name
        # it), then the token check (as auth_middleware does).
        trace_id, flags = incoming_trace(request.headers)
        request[TRACE_ID] = trace_id
        set_log_context(trace_id)
        principal = None
        if self._tokens:
            role = required_role(request.raw_path.partition("?")[0])  # (no escapes: the path as it is)
            if role is not None:
                try:
                    token = authenticate(request, self._tokens, role)
                except FunctionServiceError as exc:
                    return self._refuse(request, exc, flags)
                principal = Principal(token.tenant, token.role)
        return self._serve(request, lane[0], lane[1], principal, trace_id, flags)  # type: ignore[misc]  # (_lane: not None)

    async def _refuse(self, request: web.BaseRequest, exc: FunctionServiceError, flags: str) -> web.StreamResponse:
        return traced_error_response(request, exc, flags)

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
        if request.method != "POST" or self._serve is None:
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
