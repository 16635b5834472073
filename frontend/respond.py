"""The ending of every invoke route: its invocation is cancelled when the client leaves, and counted
(frontend/metrics.py) once the route answered, failed or lost its client.

A client that disconnects cancels the request's task (aiohttp `handler_cancellation`) or makes a
socket write fail with ConnectionError; either way the invocation is cancelled so the handler
stops, and a write failure ends the response quietly rather than as a server error. A decorator,
not a middleware: only the invoke routes pay for it, and one coroutine frame does both (each frame
is held by every open stream).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Concatenate, ParamSpec, cast

from aiohttp import web

from runtime.errors import FunctionServiceError

from .metrics import CLIENT_GONE, DISCONNECTED, INVOCATION, METRICS, InvocationStats, count_answered, count_refused

__all__ = ("invocation_route", "end_invocation", "client_left")

log = logging.getLogger("fnstream.frontend")

P = ParamSpec("P")
Route = Callable[Concatenate[web.Request, P], Awaitable[web.StreamResponse]]


def client_left() -> web.Response:
    """What a route answers when its client left (nobody reads it; access logs and metrics do)."""
    return web.Response(status=499)


def invocation_route(route: Route[P]) -> Route[P]:
    """Wrap an invoke route (`(request, ...) -> response`, which sets `request[INVOCATION]` once it
    started one): cancel the invocation if the client leaves; count it once the route ends."""

    @functools.wraps(route)
    def run(request: web.Request, /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[web.StreamResponse]:
        # Not a coroutine itself: the route's ending is the one frame (each is held by every open stream).
        return end_invocation(request.app.get(METRICS), request, route(request, *args, **kwargs), monotonic())

    return _as_coroutine_function(run)


def _as_coroutine_function(function: Route[P]) -> Route[P]:
    """Mark `function` (which returns a coroutine) as a coroutine function: aiohttp takes a route
    handler as it is only then, and would wrap anything else in a coroutine of its own (with a
    DeprecationWarning)."""
    mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
    if mark is not None:
        return cast(Route[P], mark(function))
    function._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]  # 3.11's mark
    return function


async def end_invocation(stats: InvocationStats | None, request: web.BaseRequest,
                         answer: Awaitable[web.StreamResponse], started: float) -> web.StreamResponse:
    """Await an invoke route's `answer`: cancel its invocation (`request[INVOCATION]`) if the client
    leaves; count it in `stats` once it ends (frontend/front_door.py's streams end here too)."""
    try:
        response = await answer
    except asyncio.CancelledError:
        inv = request.get(INVOCATION)
        if inv is not None:
            inv.cancel(CLIENT_GONE)
        count_refused(stats, request, DISCONNECTED, started)
        raise
    except FunctionServiceError as exc:  # StreamClosedError & co.: the function's outcome, not the client leaving
        count_refused(stats, request, exc.code, started)
        raise
    except ConnectionError as exc:  # a socket write failed: the client left
        inv = request.get(INVOCATION)
        if inv is None:
            raise
        inv.cancel(CLIENT_GONE)
        log.info("client of invocation %s of %s left: %s", inv.id, inv.spec.name, exc)
        response = client_left()
    count_answered(stats, request, response, started)
    return response
