"""The web console: static files of frontend/console/ at `/console/`, and `/` redirecting there.

No build step and no external resources: the page, its script and its stylesheet are plain files
served from the package, so the console works offline. The Content-Security-Policy keeps it so
(nothing is loaded, nor sent, anywhere but this server).
"""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

__all__ = ("routes", "CONSOLE_DIR")

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
routes = web.RouteTableDef()

_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".txt": "text/plain",
          ".svg": "image/svg+xml", ".png": "image/png"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@routes.get("/")
async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("console/")


@routes.get("/console")
async def console_no_slash(request: web.Request) -> web.Response:
    raise web.HTTPFound("console/")


@routes.get("/console/{path:.*}")
async def console_file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["path"] or "index.html"
    file = (CONSOLE_DIR / name).resolve()
    if CONSOLE_DIR not in file.parents or not file.is_file() or file.suffix not in _TYPES:
        raise web.HTTPNotFound(text=f"no console file {name!r}")
    return web.FileResponse(file, headers={**_HEADERS, "Content-Type": f"{_TYPES[file.suffix]}; charset=utf-8"})
