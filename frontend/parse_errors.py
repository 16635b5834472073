"""Errors aiohttp answers itself (before any middleware runs) in fnstream's JSON error shape.

A request aiohttp cannot parse (a header line over the size limit, too many headers, a bad
request line...) never reaches the app: aiohttp answers it with a text page from
`RequestHandler.handle_error`. `JSONErrorRunner` serves the app with a request handler that
answers those as `{"code", "message"}` with `X-Inner-Code`, like every other error.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

__all__ = ("JSONErrorRunner", "parse_error_body")

_CODES = {400: 200400, 413: 4140, 431: 200431, 500: 200500}


def parse_error_body(status: int, message: str | None) -> dict[str, Any]:
    text = (message or "").strip() if status < 500 else "internal server error"
    return {"code": _CODES.get(status, status * 1000), "message": text or f"request refused ({status})"}


class _JSONErrorHandler(RequestHandler):
    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if a response already started
        body = parse_error_body(status, message)
        resp = web.Response(status=status, text=json.dumps(body), content_type="application/json",
                            headers={"X-Inner-Code": str(body["code"])})
        resp.force_close()
        return resp


class _JSONErrorServer(Server):
    def __call__(self) -> RequestHandler:
        return _JSONErrorHandler(self, loop=self._loop, **self._kwargs)


class JSONErrorRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer parse-level errors as JSON.

    It builds the Server as `Application._make_handler` does, with the request handler above.
    """

    async def _make_server(self) -> Server:
        app = self.app
        loop = asyncio.get_running_loop()
        app._set_loop(loop)
        app.on_startup.freeze()
        await app.startup()
        app.freeze()
        return _JSONErrorServer(app._handle, request_factory=app._make_request,  # type: ignore[arg-type]
                                loop=loop, **self._kwargs)
