"""Liveness: `GET /healthz` (no auth)."""
from __future__ import annotations

from aiohttp import web

from ..keys import CONFIG, REGISTRY

__all__ = ("routes",)

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    # `auth` tells the web console whether to ask for a token before its first API call.
    return web.json_response({"status": "ok", "functions": len(request.app[REGISTRY]),
                              "auth": bool(request.app[CONFIG].auth.tokens)})
