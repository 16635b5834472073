"""Error responses: every error leaves fnstream as JSON, never as aiohttp's text pages.

Function-service routes answer `{"code", "message", "trace_id"}` with `X-Inner-Code`;
OpenAI-compatible routes (`/v1/...`, `/v2/{fn}/openai/v1/...`) answer `{"error": {"message", "type", "code"}}`;
RunPod's routes (`/v2/...`) answer RunPod's `{"error": message}`.
"""
from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from runtime.errors import FunctionServiceError

from .keys import TRACE_ID
from .metrics_counters import INVOCATION
from .tracing import TRACE_FLAGS, add_trace_headers, trace_id_of

__all__ = ("error_response", "traced_error_response", "error_middleware", "http_error_code", "is_openai_path",
           "is_runpod_path", "openai_error_body")

log = logging.getLogger("fnstream.frontend")

_HTTP_CODES = {400: 200400, 401: 200401, 403: 200403, 404: 200404, 405: 200405, 413: 4140, 429: 200429}
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def http_error_code(status: int) -> int:
    """The inner code of an HTTP-level error (`X-Inner-Code`): openYuanrong's where it has one."""
    return _HTTP_CODES.get(status, 200500 if status == 500 else 200503 if status == 503 else status * 1000)


def is_openai_path(path: str) -> bool:
    return path.startswith("/v1/") or (path.startswith("/v2/") and "/openai/v1/" in path)


def is_runpod_path(path: str) -> bool:
    """[jobs] RunPod's /v2/{fn}/... routes answer RunPod's error shape `{"error": message}`."""
    return path.startswith("/v2/")


def openai_error_body(status: int, message: str, code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "server_error"),
                      "param": None, "code": code}}


def error_response(request: web.BaseRequest, exc: FunctionServiceError) -> web.Response:
    trace_id = request.get(TRACE_ID)
    headers = {"X-Inner-Code": str(exc.code)}
    if trace_id:
        headers["X-Trace-Id"] = trace_id
    inv = request.get(INVOCATION)  # an invocation that started, then failed: it is named too
    if inv is not None:
        headers["X-Invocation-Id"] = inv.id
    if is_openai_path(request.path):
        body = openai_error_body(exc.status, exc.message, exc.code)
    elif is_runpod_path(request.path):
        body = {"error": exc.message}
    else:
        body = exc.to_dict()
        if trace_id:
            body["trace_id"] = trace_id
    return web.json_response(body, status=exc.status, headers=headers)


def traced_error_response(request: web.BaseRequest, exc: FunctionServiceError, flags: str) -> web.Response:
    """`error_response` with the trace headers (`flags`: of its traceparent, frontend/tracing.py),
    as the error middleware answers: for an invoke's refusal, which the fast lane answers too."""
    request[TRACE_FLAGS] = flags
    response = error_response(request, exc)
    add_trace_headers(request, response)
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON; and the trace headers on every answer (frontend/tracing.py)."""
    request[TRACE_ID] = trace_id_of(request)  # traceparent, X-Trace-Id or a new one
    try:
        response = await handler(request)
    except FunctionServiceError as exc:
        response = error_response(request, exc)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.empty_body:
            add_trace_headers(request, exc)  # aiohttp answers with the exception itself
            raise
        reason = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
        if exc.status == 413:
            reason = f"request body too large: {exc.text}"
        err = FunctionServiceError(reason, code=http_error_code(exc.status), status=exc.status)
        response = error_response(request, err)
    if not response.prepared:  # a streamed answer got them as it was prepared (EventStream)
        add_trace_headers(request, response)
    return response
