"""Answering with an invocation while its client may leave: written once for every route.

A client that disconnects cancels the request's task (aiohttp `handler_cancellation`) or makes a
socket write fail with ConnectionError; either way the invocation is cancelled so the handler
stops, and a write failure ends the response quietly rather than as a server error.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from runtime.errors import FunctionServiceError
from runtime.surface import InvocationSurface

__all__ = ("answer", "client_left")

log = logging.getLogger("fnstream.frontend")

CLIENT_GONE = "client disconnected"


def client_left() -> web.Response:
    """What a route answers when its client left (nobody reads it; access logs and metrics do)."""
    return web.Response(status=499)


async def answer(inv: InvocationSurface, respond: Awaitable[web.StreamResponse],
                 gone: Callable[[], web.StreamResponse]) -> web.StreamResponse:
    """`await respond` (a coroutine answering with `inv`: no closure per request); if the client
    leaves meanwhile, cancel `inv` (and answer `gone()`)."""
    try:
        return await respond
    except asyncio.CancelledError:
        inv.cancel(CLIENT_GONE)
        raise
    except ConnectionError as exc:
        if isinstance(exc, FunctionServiceError):
            raise  # StreamClosedError & co. are the function's outcome, not the client leaving
        inv.cancel(CLIENT_GONE)
        log.info("client of invocation %s of %s left: %s", inv.id, inv.spec.name, exc)
        return gone()
