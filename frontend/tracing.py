"""Request ids on every answer: the trace id from `traceparent` (W3C) or `X-Trace-Id`, echoed back.

`trace_id_of` picks the request's trace id (an incoming `traceparent` wins, then `X-Trace-Id`,
else a new one). `add_trace_headers` sets `X-Trace-Id`, `X-Request-Id` (the same id: the openai
and other SDKs read it as `request_id`) and a `traceparent` naming this server's span on every
answer before its headers go out (JSON, SSE, errors, 401s alike): the error middleware calls it
on what the app answers, `EventStream` before its first write, the listener on its 500s. Not an
`on_response_prepare` signal: that costs a coroutine per request on top of the call itself.
"""
from __future__ import annotations

from aiohttp import web

from runtime.invocation import new_trace_id
from runtime.logs import set_log_context
from runtime.tracing import is_w3c_trace_id, new_span_id, parse_traceparent

from .keys import TRACE_ID

__all__ = ("trace_id_of", "add_trace_headers", "TRACE_FLAGS")

# The trace flags of the answer's traceparent: the incoming one's, "01" (sampled) for a trace
# started here, "" when the trace id is not a W3C one (a custom X-Trace-Id) and none can be sent.
TRACE_FLAGS = web.RequestKey("trace_flags", str)


def trace_id_of(request: web.Request) -> str:
    """The request's trace id; also names it in log records made while the request runs."""
    headers = request.headers
    traceparent = headers.get("traceparent")
    parent = parse_traceparent(traceparent) if traceparent else None
    if parent is not None:
        trace_id, flags = parent[0], parent[2]
    else:
        custom = headers.get("X-Trace-Id")
        if custom:
            trace_id, flags = custom, ("01" if is_w3c_trace_id(custom) else "")
        else:
            trace_id, flags = new_trace_id(), "01"
    request[TRACE_FLAGS] = flags
    set_log_context(trace_id)
    return trace_id


def add_trace_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    try:
        trace_id = request[TRACE_ID]
    except KeyError:
        return  # answered before the error middleware ran
    headers = response.headers
    trace_id = headers.setdefault("X-Trace-Id", trace_id)
    headers["X-Request-Id"] = trace_id
    try:
        flags = request[TRACE_FLAGS]
    except KeyError:  # the trace id was set by other code than trace_id_of
        flags = "01" if is_w3c_trace_id(trace_id) else ""
    if flags and "traceparent" not in headers:
        headers["traceparent"] = f"00-{trace_id}-{new_span_id()}-{flags}"
