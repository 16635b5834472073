"""Request ids on every answer: the trace id from `traceparent` (W3C) or `X-Trace-Id`, echoed back.

`trace_id_of` picks the request's trace id (an incoming `traceparent` wins, then `X-Trace-Id`,
else a new one). `add_trace_headers` sets `X-Trace-Id`, `X-Request-Id` (the same id: the openai
and other SDKs read it as `request_id`) and a `traceparent` naming this server's span on every
answer before its headers go out (JSON, SSE, errors, 401s alike): the error middleware calls it
on what the app answers, `EventStream` as it is made (`trace_headers`), the fast lane on its
answers, the listener on its 500s. Not an
`on_response_prepare` signal: that costs a coroutine per request on top of the call itself.
"""
from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDictProxy, istr

from runtime.invocation_ids import new_trace_id
from runtime.logs import set_log_context
from runtime.tracing import is_w3c_trace_id, new_span_id, parse_traceparent

from .keys import TRACE_ID

__all__ = ("incoming_trace", "trace_id_of", "answer_trace_headers", "trace_headers", "add_trace_headers", "TRACE_FLAGS")

# Header names looked up on every request, as case-insensitive keys made once.
_TRACEPARENT = istr("traceparent")
_X_TRACE_ID = istr("X-Trace-Id")
_X_REQUEST_ID = istr("X-Request-Id")


# The trace flags of the answer's traceparent: the incoming one's, "01" (sampled) for a trace
# started here, "" when the trace id is not a W3C one (a custom X-Trace-Id) and none can be sent.
TRACE_FLAGS = web.RequestKey("trace_flags", str)


def incoming_trace(headers: CIMultiDictProxy[str]) -> tuple[str, str]:
    """A request's trace id and the flags of its answer's `traceparent` (see TRACE_FLAGS)."""
    traceparent = headers.get(_TRACEPARENT)
    parent = parse_traceparent(traceparent) if traceparent else None
    if parent is not None:
        return parent[0], parent[2]
    custom = headers.get(_X_TRACE_ID)
    if custom:
        return custom, ("01" if is_w3c_trace_id(custom) else "")
    return new_trace_id(), "01"


def trace_id_of(request: web.BaseRequest) -> str:
    """The request's trace id; also names it in log records made while the request runs."""
    trace_id, request[TRACE_FLAGS] = incoming_trace(request.headers)
    set_log_context(trace_id)
    return trace_id


def answer_trace_headers(trace_id: str, flags: str) -> dict[str, str]:
    """`X-Trace-Id`, `X-Request-Id` and (flags given: a W3C trace) a `traceparent` naming this
    server's span of the trace."""
    headers: dict[str, str] = {_X_TRACE_ID: trace_id, _X_REQUEST_ID: trace_id}
    if flags:
        headers[_TRACEPARENT] = f"00-{trace_id}-{new_span_id()}-{flags}"
    return headers


def trace_headers(request: web.BaseRequest, trace_id: str | None = None) -> dict[str, str]:
    """`X-Trace-Id`, `X-Request-Id` and `traceparent` of an answer to `request`, whose answer may
    already name its `trace_id`; none for a request answered before its trace id was picked."""
    own = request.get(TRACE_ID)
    if own is None:
        return {}
    trace_id = trace_id or own
    flags = request.get(TRACE_FLAGS)
    if flags is None:  # the trace id was set by other code than trace_id_of
        flags = "01" if is_w3c_trace_id(trace_id) else ""
    return answer_trace_headers(trace_id, flags)


def add_trace_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Set `trace_headers` on a response not yet sent (those it already has stay)."""
    headers = response.headers
    for name, value in trace_headers(request, headers.get("X-Trace-Id")).items():
        headers.setdefault(name, value)
