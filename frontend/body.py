"""Reading request bodies with the configured size limit and clear errors."""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from runtime.errors import BadRequestError, BodyTooLargeError

from . import safe_json
from .keys import CONFIG
from .server import refuse_rest_of_body

__all__ = ("read_body", "read_json_body", "max_body_bytes")


def max_body_bytes(app: web.Application) -> int:
    return int(app[CONFIG].frontend.args.maxRequestBodySize * 1024 * 1024)


async def read_body(request: web.Request) -> bytes:
    """The request's body, whole; 413 past `maxRequestBodySize` (decompressed), 400 when it cannot be
    read (a corrupt `Content-Encoding`). What is left of a refused compressed body is not read on
    (`refuse_rest_of_body`)."""
    limit = max_body_bytes(request.app)
    if request.content_length is not None and request.content_length > limit:
        refuse_rest_of_body(request)
        raise BodyTooLargeError(f"request body of {request.content_length} bytes exceeds "
                                f"frontend.args.maxRequestBodySize ({limit} bytes)")
    payload = request.content
    if payload.is_eof() and payload.exception() is None:
        # The whole body has already arrived (a small request, the usual case): take it as it is,
        # without request.read()'s chunk loop. Every route reads its body here, once.
        raw = payload.read_nowait()
        if len(raw) > limit:  # decompressed (Content-Encoding), so larger than its Content-Length
            refuse_rest_of_body(request)
            raise BodyTooLargeError(f"request body exceeds frontend.args.maxRequestBodySize ({limit} bytes)")
        return raw
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        refuse_rest_of_body(request)
        raise BodyTooLargeError(f"request body exceeds frontend.args.maxRequestBodySize ({limit} bytes)") from None
    except RequestPayloadError as exc:  # e.g. a body whose gzip/deflate encoding is corrupt
        refuse_rest_of_body(request)
        raise BadRequestError(f"request body could not be read: {exc}") from None


async def read_json_body(request: web.Request) -> Any:
    """The parsed JSON body; an empty body is `{}`."""
    raw = await read_body(request)
    if not raw.strip():
        return {}
    try:
        return safe_json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                              f"column {exc.colno}") from None
