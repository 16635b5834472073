"""Request ids on every answer: the trace id from `traceparent` (W3C) or `X-Trace-Id`, echoed back.

`trace_id_of` picks the request's trace id (an incoming `traceparent` wins, then `X-Trace-Id`,
else a new one). `add_trace_headers` runs on every response before its headers go out (JSON,
SSE, errors, 401s alike) and sets `X-Trace-Id`, `X-Request-Id` (the same id: the openai and
other SDKs read it as `request_id`) and a `traceparent` naming this server's span.
"""
from __future__ import annotations

from aiohttp import web

from runtime.invocation import new_trace_id
from runtime.logs import set_log_context
from runtime.tracing import make_traceparent, parse_traceparent

from .keys import TRACE_ID

__all__ = ("trace_id_of", "add_trace_headers", "TRACE_FLAGS")

# The sampled flag of the incoming traceparent, kept for the one this server answers with.
TRACE_FLAGS = web.RequestKey("trace_flags", str)


def trace_id_of(request: web.Request) -> str:
    """The request's trace id; also names it in log records made while the request runs."""
    parent = parse_traceparent(request.headers.get("traceparent"))
    if parent is not None:
        trace_id = parent[0]
        request[TRACE_FLAGS] = parent[2]
    else:
        trace_id = request.headers.get("X-Trace-Id") or new_trace_id()
    set_log_context(trace_id)
    return trace_id


async def add_trace_headers(request: web.Request, response: web.StreamResponse) -> None:
    trace_id = request.get(TRACE_ID)
    if not trace_id:
        return
    headers = response.headers
    headers.setdefault("X-Trace-Id", trace_id)
    headers["X-Request-Id"] = headers["X-Trace-Id"]
    if "traceparent" not in headers:
        parent = make_traceparent(trace_id, flags=request.get(TRACE_FLAGS, "01"))
        if parent is not None:
            headers["traceparent"] = parent
