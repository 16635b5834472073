"""Reading request bodies with the configured size limit and clear errors."""
from __future__ import annotations

import json
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from runtime.errors import BadRequestError, BodyTooLargeError

from . import safe_json
from .keys import CONFIG

__all__ = ("arrived_body", "read_body", "parse_json_body", "read_json_body", "max_body_bytes", "max_body_values",
           "refuse_rest_of_body")


def max_body_bytes(app: web.Application) -> int:
    return int(app[CONFIG].frontend.args.maxRequestBodySize * 1024 * 1024)


def refuse_rest_of_body(request: web.BaseRequest) -> None:
    """The route refused the request's body (413, 400): a compressed body is not read on once the
    answer is out (aiohttp's lingering close reads what is left for up to 10 s so that the client
    can finish sending and read the answer, and would inflate a gzip bomb on the event loop). An
    identity body is still drained so: closing with unread bytes would reset the connection, and
    the client would see a reset instead of its 413."""
    protocol = request.protocol
    if request.headers.get("Content-Encoding") and isinstance(protocol, RequestHandler):
        protocol._lingering_time = 0.0


def arrived_body(request: web.BaseRequest, limit: int) -> bytes | None:
    """The request's body if it has arrived whole (a small request, the usual case), taken as it is
    without request.read()'s chunk loop; None while it is still arriving. 413 past `limit`."""
    declared = request.content_length
    if declared is not None and declared > limit:
        refuse_rest_of_body(request)
        raise BodyTooLargeError(f"request body of {declared} bytes exceeds "
                                f"frontend.args.maxRequestBodySize ({limit} bytes)")
    payload = request.content
    if not payload.is_eof() or payload.exception() is not None:
        return None
    raw = payload.read_nowait()
    if len(raw) > limit:  # decompressed (Content-Encoding), so larger than its Content-Length
        refuse_rest_of_body(request)
        raise BodyTooLargeError(f"request body exceeds frontend.args.maxRequestBodySize ({limit} bytes)")
    return raw


async def read_body(request: web.BaseRequest, limit: int | None = None) -> bytes:
    """The request's body, whole; 413 past `limit` (`maxRequestBodySize`, decompressed), 400 when it
    cannot be read (a corrupt `Content-Encoding`). What is left of a refused compressed body is not
    read on (`refuse_rest_of_body`). Every route reads its body here, once."""
    if limit is None:
        limit = max_body_bytes(cast(web.Request, request).app)
    raw = arrived_body(request, limit)
    if raw is not None:
        return raw
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        refuse_rest_of_body(request)
        raise BodyTooLargeError(f"request body exceeds frontend.args.maxRequestBodySize ({limit} bytes)") from None
    except RequestPayloadError as exc:  # e.g. a body whose gzip/deflate encoding is corrupt
        refuse_rest_of_body(request)
        raise BadRequestError(f"request body could not be read: {exc}") from None


def max_body_values(app: web.Application) -> int:
    return app[CONFIG].frontend.args.maxBodyValues


def parse_json_body(raw: bytes, max_values: int | None = None) -> Any:
    """A request body as JSON (400 when it is not; 413 past `max_values` values (arrays,
    objects, their elements and members), before it is parsed); an empty body is `{}`."""
    if not raw or raw.isspace():
        return {}
    try:
        return safe_json.loads(raw, max_values=max_values)
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                              f"column {exc.colno}") from None


async def read_json_body(request: web.Request) -> Any:
    """The parsed JSON body; an empty body is `{}`."""
    return parse_json_body(await read_body(request), max_body_values(request.app))
