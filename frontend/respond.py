"""The ending of a route that runs an invocation (the OpenAI routes'): its invocation is cancelled
when the client leaves, and counted (frontend/metrics_counters.py) once the route answered, failed
or lost its client.

A client that disconnects cancels the request's task (aiohttp `handler_cancellation`) or makes a
socket write fail with ConnectionError; either way the invocation is cancelled so the handler
stops, and a write failure ends the response quietly rather than as a server error. A decorator,
not a middleware: only the invoke routes pay for it, and one coroutine frame does both (each frame
is held by every open stream). The invoke behind both doors (frontend/routes/invoke.py
`Invoker.serve`) ends its calls the same way, written out in its one frame.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Any, Concatenate, ParamSpec

from aiohttp import web

from runtime.errors import FunctionServiceError

from .keys import OUTPUTS
from .metrics_counters import CLIENT_GONE, DISCONNECTED, INVOCATION, METRICS, count_answered, count_refused

__all__ = ("invocation_route", "client_left")

log = logging.getLogger("fnstream.frontend")

P = ParamSpec("P")
Route = Callable[Concatenate[web.Request, P], Awaitable[web.StreamResponse]]


def client_left() -> web.Response:
    """What a route answers when its client left (nobody reads it; access logs and metrics do)."""
    return web.Response(status=499)


def _client_left(request: web.Request, inv: Any) -> None:
    """Cancel `inv`, whose client left; or not, if it is kept with onDisconnect: continue."""
    outputs = request.app.get(OUTPUTS)
    if outputs is None:
        inv.cancel(CLIENT_GONE)
    else:
        outputs.client_left(inv, CLIENT_GONE)


def invocation_route(route: Route[P]) -> Route[P]:
    """Wrap an invoke route (`(request, ...) -> response`, which sets `request[INVOCATION]` once it
    started one): cancel the invocation if the client leaves; count it once the route ends."""

    @functools.wraps(route)
    async def run(request: web.Request, /, *args: P.args, **kwargs: P.kwargs) -> web.StreamResponse:
        started = monotonic()
        try:
            response = await route(request, *args, **kwargs)
        except asyncio.CancelledError:
            inv = request.get(INVOCATION)
            if inv is not None:
                _client_left(request, inv)
            count_refused(request.app.get(METRICS), request, DISCONNECTED, started)
            raise
        except FunctionServiceError as exc:  # StreamClosedError & co. are the function's outcome,
            count_refused(request.app.get(METRICS), request, exc.code, started)  # not the client leaving
            raise
        except ConnectionError as exc:  # a socket write failed: the client left
            inv = request.get(INVOCATION)
            if inv is None:
                raise
            _client_left(request, inv)
            log.info("client of invocation %s of %s left: %s", inv.id, inv.spec.name, exc)
            response = client_left()
        count_answered(request.app.get(METRICS), request, response, started)
        return response

    return run
