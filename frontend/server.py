"""The listener: aiohttp's runner and request handler with the limits of `frontend.limits`.

A server in front of the internet must bound what a client can hold: an idle keep-alive connection
(`keepAliveSeconds`), the time to send a request's headers (`headerTimeoutSeconds`, so a slowloris
client sending one byte a second, or nothing, is closed) and its body (`bodyTimeoutSeconds`), the
size of its headers (each field, and the unfinished heads of one request and of all connections
together: a client's bytes held before any authentication), a response it stops taking
(`sendTimeoutSeconds`), and the number of open connections (`maxConnections`: past it a new one
is answered 503 instead of running the process out of file descriptors). None of these cut a
response a client keeps reading: an SSE stream runs as long as its handler writes. Errors that
never reach the app (bad or too large headers, timeouts, overload) are answered in fnstream's JSON
shape, not aiohttp's text pages.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from runtime.config import Config, FrontendLimits
from runtime.errors import ConfigError
from runtime.fork_guard import release_listener_in_forked_children
from runtime.invocation_ids import new_trace_id
from runtime.tracing import make_traceparent

from .errors import http_error_code
from .front_door import FrontDoor
from .keys import TRACE_ID
from .os_resources import malloc_trim
from .tracing import add_trace_headers

__all__ = ("FnstreamRunner", "ListenError", "start_site")

log = logging.getLogger("fnstream.frontend")


class ListenError(ConfigError):
    """The listening address cannot be had: a startup error, as a bad config is (exit 2)."""


def _raw_error(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response, for connections the app never sees (with a trace id of its
    own, as every answer has)."""
    code = http_error_code(status)
    body = json.dumps({"code": code, "message": message}).encode()
    trace_id = new_trace_id()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nX-Inner-Code: {code}\r\nConnection: close\r\n"
            f"X-Trace-Id: {trace_id}\r\nX-Request-Id: {trace_id}\r\ntraceparent: {make_traceparent(trace_id)}\r\n")
    if status == 503:
        head += "Retry-After: 1\r\n"
    return (head + "\r\n").encode() + body


# Offset of `tcpi_bytes_acked` (u64) in Linux's struct tcp_info (since Linux 4.1).
_TCPI_BYTES_ACKED = 120


def _bytes_taken(transport: asyncio.BaseTransport | None) -> int:
    """How much of what was sent the client has taken: the bytes its TCP acknowledged (Linux), which
    move however large the kernel's send queue in between is; elsewhere, less held in the
    transport's buffer (negated), a coarser sign (the kernel's queue may hide a slow reader's reads)."""
    if transport is None:
        return 0
    sock = transport.get_extra_info("socket")
    if sock is not None and hasattr(socket, "TCP_INFO"):
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except OSError:
            pass
        else:
            if len(info) >= _TCPI_BYTES_ACKED + 8:
                return int(struct.unpack_from("=Q", info, _TCPI_BYTES_ACKED)[0])
    return -cast(asyncio.WriteTransport, transport).get_write_buffer_size()


class _HeadBudget:
    """Bytes of unfinished request heads held across one server's connections.

    Each connection may hold `maxHeaderBytes`; together they may hold `maxHeaderBytesInFlight`, so
    10,000 connections trickling headers cannot take gigabytes before any of them is authenticated.
    Once a large amount was held and all of it is released, the C heap is trimmed: the parser's
    buffers are freed to malloc, which otherwise keeps the pages (RSS stays at its peak)."""

    __slots__ = ("_peak", "_trimmed_at", "held", "limit")

    TRIM_AFTER = 8 * 1024 * 1024

    def __init__(self, limit: int) -> None:
        self.held = 0
        self.limit = limit
        self._peak = 0
        self._trimmed_at = 0.0

    def add(self, n: int) -> bool:
        """Hold n more bytes; False when that passes the limit (the caller refuses the connection)."""
        self.held += n
        self._peak = max(self._peak, self.held)
        return self.held <= self.limit

    def release(self, n: int) -> None:
        self.held -= n
        if self.held == 0 and self._peak >= self.TRIM_AFTER:
            now = time.monotonic()
            if now - self._trimmed_at >= 1.0:  # a trim walks the heap: at most once a second
                self._trimmed_at = now
                self._peak = 0
                malloc_trim()


class _LimitedHandler(RequestHandler):
    """aiohttp's per-connection protocol plus the header and body deadlines."""

    # Slots, as aiohttp's own: without them every connection carried an instance dict as well.
    __slots__ = ("_body", "_body_timer", "_budget", "_head_bytes", "_head_held", "_head_timer", "_limits",
                 "_send_timer", "_taken")

    def __init__(self, manager: web.Server, *, limits: FrontendLimits, budget: _HeadBudget, **kwargs: Any) -> None:
        super().__init__(manager, keepalive_timeout=limits.keepAliveSeconds, max_line_size=limits.maxHeaderFieldSize,
                         max_field_size=limits.maxHeaderFieldSize, max_headers=limits.maxHeaders, **kwargs)
        self._limits = limits
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._budget = budget
        self._head_held = 0  # of _head_bytes, what this connection holds of the budget
        self._body_timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._taken = 0  # what the client had taken when the send timer was armed (_bytes_taken)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Bytes that leave a request head incomplete, with no request running, start its header
        # deadline (a head arriving whole in one read, the usual case, arms no timer at all); while
        # a request runs, bytes are its body, or pipelined requests bounded by the keep-alive timeout.
        self._head_bytes += len(data)
        before = self._request_count
        super().data_received(data)
        if self._request_count > before:  # a request line and headers arrived whole
            self._cancel_head_timer()
            payload = self._messages[-1][1] if self._messages else None
            if isinstance(payload, StreamReader) and not payload.is_eof():
                self._arm_body_timer(payload)
        elif self._head_timer is None and data and self._idle():
            self._arm_head_timer(counted=len(data))
            self._hold_head()
        elif self._head_timer is not None:  # armed while idle, and no request finished since: a head
            self._hold_head()
        if self._body is not None and self._body.is_eof():
            self._cancel_body_timer()

    def pause_writing(self) -> None:
        # The transport's buffer is full: the client is not taking what we send as fast. Paused for
        # a whole sendTimeoutSeconds with nothing taken, the connection is aborted (a client that
        # never reads would hold it, its response and maxConnections' slot forever); one that took
        # some is slow, and is given another period.
        super().pause_writing()
        self._arm_send_timer()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_send_timer()

    def _arm_send_timer(self) -> None:
        self._taken = _bytes_taken(self.transport)
        self._send_timer = self._loop.call_later(self._limits.sendTimeoutSeconds, self._send_timeout)

    def _send_timeout(self) -> None:
        self._send_timer = None
        transport = self.transport
        if transport is None or not self._paused:
            return
        if _bytes_taken(transport) != self._taken:  # slow, not stalled
            self._arm_send_timer()
            return
        log.info("aborting a connection whose client took nothing for %g s (frontend.limits.sendTimeoutSeconds)",
                 self._limits.sendTimeoutSeconds)
        transport.abort()  # close() would wait to flush what the client will not take

    def _idle(self) -> bool:
        """aiohttp's request loop is parked waiting for the next request (its own state, read
        rather than kept with a wrapper around each response). Not `_request_in_progress`: that is
        set only once the request's task first runs, a loop turn after the request left `_messages`."""
        return self._waiter is not None and not self._messages

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's answer to an unparsable request or an unhandled error, as fnstream JSON.

        A malformed request is the client's doing, and anyone on the internet can send them: logged
        at debug, one line (aiohttp's own handler logs each as an error with its traceback, which
        lets a client flood the logs). A server error keeps its traceback."""
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:
            log.debug("malformed request from %s: %s", request.remote, exc)
        if request.writer.output_size > 0:  # part of a response went out: no other can follow
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        if isinstance(exc, LineTooLong) or "Too many headers" in str(exc):
            status = 431
            message = (f"request headers too large: at most {self._limits.maxHeaders} header lines, and a URL, "
                       f"header name or value of at most {self._limits.maxHeaderFieldSize} bytes (frontend.limits)")
        elif status == 500:
            message = "internal server error"
        code = http_error_code(status)
        resp = web.json_response({"code": code, "message": message or "bad request"}, status=status,
                                 headers={"X-Inner-Code": str(code)})
        if TRACE_ID not in request:  # one the app never saw (unparsable): a trace id of its own
            request[TRACE_ID] = new_trace_id()
        add_trace_headers(request, resp)
        resp.force_close()
        return resp

    def _hold_head(self) -> None:
        """An unfinished head grew: count it against this request's and the server's bounds."""
        more = self._head_bytes - self._head_held
        self._head_held = self._head_bytes
        within = self._budget.add(more)
        if self._head_bytes > self._limits.maxHeaderBytes:
            self._refuse_head(_raw_error(431, "Request Header Fields Too Large", "request headers too large: "
                                         f"at most {self._limits.maxHeaderBytes} bytes of request line and "
                                         "headers (frontend.limits.maxHeaderBytes)"))
        elif not within:
            log.warning("refusing a connection with 503: unfinished request heads hold %d bytes "
                        "(frontend.limits.maxHeaderBytesInFlight)", self._budget.held)
            self._refuse_head(_raw_error(503, "Service Unavailable", "too many unfinished request headers "
                                         "in flight (frontend.limits.maxHeaderBytesInFlight); retry later"))

    def _refuse_head(self, answer: bytes) -> None:
        self._cancel_head_timer()
        if self.transport is not None:
            self.transport.write(answer)
        self.force_close()

    def _release_head(self) -> None:
        self._budget.release(self._head_held)
        self._head_held = 0

    def _arm_head_timer(self, counted: int = 0) -> None:
        self._head_bytes = counted
        self._head_timer = self._loop.call_later(self._limits.headerTimeoutSeconds, self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._head_held:
            self._release_head()
        if self.transport is None or not self._idle():
            return
        if self._head_bytes:  # a client that sent nothing gets nothing back, as from nginx
            self.transport.write(_raw_error(408, "Request Timeout", "request headers did not arrive within "
                                            f"frontend.limits.headerTimeoutSeconds "
                                            f"({self._limits.headerTimeoutSeconds:g} s)"))
        self.force_close()

    def _arm_body_timer(self, payload: StreamReader) -> None:
        self._cancel_body_timer()
        self._body = payload
        self._body_timer = self._loop.call_later(self._limits.bodyTimeoutSeconds, self._body_timeout)

    def _body_timeout(self) -> None:
        """A body still incomplete: its reader raises 408 (the route answers it); then the connection closes.

        Not while this server has stopped reading (its buffer full, e.g. a pipelined request waiting
        behind a long one): then the client is not slow, we are, and the deadline starts again."""
        self._body_timer = None
        payload = self._body
        if payload is None or payload.is_eof() or self.transport is None:
            self._body = None
            return
        if self._reading_paused or self._buffer_paused:  # the body's buffer, or aiohttp's queue of requests
            self._body_timer = self._loop.call_later(self._limits.bodyTimeoutSeconds, self._body_timeout)
            return
        self._body = None
        payload.set_exception(web.HTTPRequestTimeout(
            text=f"request body did not arrive within frontend.limits.bodyTimeoutSeconds "
                 f"({self._limits.bodyTimeoutSeconds:g} s)"))
        self._lingering_time = 0.0  # do not wait for the rest of a body that is not coming
        self.close()

    def _cancel_head_timer(self) -> None:
        if self._head_held:  # (checked here: this runs for every request, a call for none of them)
            self._release_head()
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._body = None

    def _cancel_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        self._cancel_send_timer()


class _Overloaded(asyncio.Protocol):
    """A connection past `maxConnections`: read the request head, answer 503, close."""

    _last_warning = 0.0

    def __init__(self, limits: FrontendLimits) -> None:
        self._limits = limits
        self._transport: asyncio.Transport | None = None
        self._seen = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self._timer = asyncio.get_running_loop().call_later(min(1.0, self._limits.headerTimeoutSeconds),
                                                            self._answer)
        now = time.monotonic()
        if now - _Overloaded._last_warning > 10:
            _Overloaded._last_warning = now
            log.warning("refusing connections with 503: %d open (frontend.limits.maxConnections)",
                        self._limits.maxConnections)

    def data_received(self, data: bytes) -> None:
        seen = self._seen + data  # the head's end may straddle reads, or be followed by a body
        self._seen = seen[-3:]
        if b"\r\n\r\n" in seen or b"\n\n" in seen:
            self._answer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def _answer(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(_raw_error(503, "Service Unavailable", "too many open connections "
                                         f"(frontend.limits.maxConnections={self._limits.maxConnections}); "
                                         "retry later"))
        self._transport.close()


class _LimitedServer(web.Server):
    """aiohttp's connection factory, handing out `_LimitedHandler`s up to `maxConnections`."""

    def __init__(self, *args: Any, limits: FrontendLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._budget = _HeadBudget(limits.maxHeaderBytesInFlight)

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]
        if len(self._connections) >= self._limits.maxConnections:
            return _Overloaded(self._limits)
        return _LimitedHandler(self, loop=self._loop, limits=self._limits, budget=self._budget, **self._kwargs)


SHUTDOWN_MARGIN = 1.0  # s past the grace for open responses to end (an aborted stream's error and [DONE])


class FnstreamRunner(web.AppRunner):
    """`web.AppRunner` whose connections carry `frontend.limits`, and whose requests come in by the
    front door (frontend/front_door.py: plain invokes, JSON or SSE, straight to the app's invoke;
    `fast_lane=False`: every request through the app).

    With `grace` (`fnstream serve`: shutdownGraceSeconds), what aiohttp gives the responses still
    open after the app's shutdown (the node's drain) is what is left of the grace plus
    SHUTDOWN_MARGIN, not a fixed time: then it cancels them (their handlers end at once)."""

    def __init__(self, app: web.Application, limits: FrontendLimits, *, grace: float | None = None,
                 fast_lane: bool = True, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits
        self._grace = grace
        self._fast_lane = fast_lane
        self._server_kwargs = {k: v for k, v in kwargs.items() if k not in ("shutdown_timeout", "handle_signals")}

    async def shutdown(self) -> None:
        started = time.monotonic()
        await super().shutdown()  # the app's on_shutdown: the drain, within the grace
        if self._grace is not None:  # BaseRunner.cleanup passes it to the server next
            self._shutdown_timeout = max(0.0, self._grace - (time.monotonic() - started)) + SHUTDOWN_MARGIN

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()  # runs the app's startup and freezes it
        door = FrontDoor(self.app, base.request_handler, self._fast_lane)
        return _LimitedServer(door, request_factory=base.request_factory, loop=asyncio.get_running_loop(),
                              limits=self._limits, **self._server_kwargs)


async def start_site(runner: web.BaseRunner, config: Config, host: str, port: int) -> web.TCPSite:
    """Listen with `frontend.backlog` and, when `frontend.reusePort`, SO_REUSEPORT; ListenError
    (exit 2, the message naming the address) when the address cannot be had."""
    site = web.TCPSite(runner, host, port, backlog=config.frontend.backlog,
                       reuse_port=True if config.frontend.reusePort else None)
    try:
        await site.start()
    except OSError as exc:  # in use, not this machine's address, no permission
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    server = site._server  # aiohttp internal (tests/frontend/test_aiohttp_internals.py)
    for sock in getattr(server, "sockets", ()):
        release_listener_in_forked_children(sock)  # a handler's fork must not take nor keep our connections
    return site
