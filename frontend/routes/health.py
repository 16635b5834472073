"""Liveness: `GET /healthz` (no auth)."""
from __future__ import annotations

from aiohttp import web

from ..keys import REGISTRY

__all__ = ("routes",)

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "functions": len(request.app[REGISTRY])})
