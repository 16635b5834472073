"""The load client: raw asyncio sockets, so the client costs far less CPU than the server.

Streams: one connection per stream (`Connection: close`), the body read to EOF, events counted
as blank-line terminators (`\\n\\n`) with C-speed `bytes.count` — every target writes whole events
per chunk, so chunk framing never splits one. Invokes: keep-alive connections, responses framed
by Content-Length. Times are `time.perf_counter()` seconds.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

__all__ = ("Target", "StreamResult", "open_stream", "run_streams", "burst_streams", "hold_streams", "run_invokes",
           "percentile",
           "subscribe", "keep_alive", "post_request")


@dataclass(frozen=True)
class Target:
    """Where a scenario sends its requests; `stream_path` is None when the target cannot stream."""

    name: str
    host: str
    port: int
    stream_path: str | None
    echo_path: str | None
    sse_accept: bool = True


def _request(target: Target, path: str, body: bytes | None, *, keep_alive: bool, sse: bool) -> bytes:
    """POST with a JSON body, or GET when `body` is None."""
    if body is None:
        head = [f"GET {path} HTTP/1.1", f"Host: {target.host}:{target.port}",
                "Connection: " + ("keep-alive" if keep_alive else "close")]
        if sse:
            head.append("Accept: text/event-stream")
        return ("\r\n".join(head) + "\r\n\r\n").encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {target.host}:{target.port}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: " + ("keep-alive" if keep_alive else "close")]
    if sse and target.sse_accept:
        head.append("Accept: text/event-stream")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class StreamResult:
    status: int = 0
    events: int = 0          # blank-line terminated events, [DONE] included
    sent: float = 0.0
    first_event: float | None = None
    ended: float | None = None
    head: bytes = b""

    @property
    def ttfe(self) -> float | None:
        return None if self.first_event is None else self.first_event - self.sent


class _StreamProtocol(asyncio.Protocol):
    """Counts events of one SSE response until the server closes the connection."""

    def __init__(self, done: asyncio.Future) -> None:
        self.result = StreamResult()
        self.done = done
        self.transport: asyncio.Transport | None = None
        self._head = b""
        self._in_body = False
        self._last = b""
        self.waiter: asyncio.Future | None = None  # set by a caller that awaits the next event

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        r = self.result
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            r.head = self._head[:end]
            r.status = int(self._head[9:12])
            data = self._head[end + 4:]
            self._in_body = True
            if not data:
                return
        n = data.count(b"\n\n")
        if self._last == b"\n" and data[:1] == b"\n":
            n += 1
        self._last = data[-1:]
        if n:
            if r.first_event is None:
                r.first_event = time.perf_counter()
            r.events += n
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(time.perf_counter())

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.result.ended = time.perf_counter()
        if not self.done.done():
            self.done.set_result(self.result)


async def open_stream(target: Target, event: dict | None,
                      path: str | None = None) -> tuple[asyncio.Transport, _StreamProtocol, bytes]:
    """Connect (untimed) and return the transport, protocol and request bytes, ready to send.

    POST `event` to the target's stream path, or GET `path` when `event` is None.
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, proto = await loop.create_connection(lambda: _StreamProtocol(done), target.host, target.port)
    body = None if event is None else json.dumps(event).encode()
    req = _request(target, path or target.stream_path, body, keep_alive=False, sse=True)
    return transport, proto, req


async def subscribe(target: Target, path: str, count: int) -> list[_StreamProtocol]:
    """`count` GET SSE subscriptions to `path`, each answered (status line and headers read)."""
    protos = []
    for _ in range(count):
        transport, proto, req = await open_stream(target, None, path)
        proto.result.sent = time.perf_counter()
        transport.write(req)
        protos.append(proto)
    while any(p.result.status == 0 and not p.done.done() for p in protos):
        await asyncio.sleep(0.005)
    bad = [p.result.status for p in protos if p.result.status != 200]
    if bad:
        raise RuntimeError(f"{target.name}: subscriptions answered {bad[:3]}")
    return protos


async def keep_alive(target: Target) -> _KeepAliveProtocol:
    """One keep-alive connection; `await proto.request(_request(...))` gives (status, body)."""
    return (await asyncio.get_running_loop().create_connection(_KeepAliveProtocol, target.host, target.port))[1]


def post_request(target: Target, path: str, body: bytes) -> bytes:
    return _request(target, path, body, keep_alive=True, sse=False)


async def run_streams(target: Target, event: dict, concurrency: int, connect_limit: int = 100) -> list[StreamResult]:
    """Open `concurrency` connections first, then send every request at once; wait for all ends."""
    gate = asyncio.Semaphore(connect_limit)

    async def connect():
        async with gate:
            return await open_stream(target, event)

    conns = await asyncio.gather(*(connect() for _ in range(concurrency)))
    for transport, proto, req in conns:
        proto.result.sent = time.perf_counter()
        transport.write(req)
    return list(await asyncio.gather(*(proto.done for _t, proto, _r in conns)))


async def burst_streams(target: Target, event: dict, count: int) -> list[StreamResult]:
    """`count` clients arriving at once, each connecting and sending as soon as it can: no ramp and no
    pre-opened connections. `sent` is when its connect began, so TTFE includes the TCP handshake and
    any SYN the server's listen backlog dropped (each costs a 1 s retransmit)."""

    async def one() -> StreamResult:
        began = time.perf_counter()
        transport, proto, req = await open_stream(target, event)
        proto.result.sent = began
        transport.write(req)
        return await proto.done

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def hold_streams(target: Target, event: dict, count: int, connect_limit: int = 100) -> list:
    """Open `count` streams and wait until each got its first event; the caller closes them."""
    gate = asyncio.Semaphore(connect_limit)

    async def one():
        async with gate:
            transport, proto, req = await open_stream(target, event)
        proto.result.sent = time.perf_counter()
        transport.write(req)
        while proto.result.events == 0:
            if proto.done.done():
                raise RuntimeError(f"{target.name}: stream ended before its first event "
                                   f"(status {proto.result.status})")
            await asyncio.sleep(0.01)
        return transport

    return list(await asyncio.gather(*(one() for _ in range(count))))


class _KeepAliveProtocol(asyncio.Protocol):
    """One keep-alive connection, one request at a time; responses framed by Content-Length."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.buf = b""
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def request(self, data: bytes) -> asyncio.Future:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        length = 0
        at = head.find(b"content-length:")
        if at >= 0:
            eol = head.find(b"\r\n", at)
            length = int(head[at + 15:eol if eol >= 0 else len(head)])
        if len(self.buf) < end + 4 + length:
            return
        status = int(self.buf[9:12])
        body = self.buf[end + 4:end + 4 + length]
        self.buf = self.buf[end + 4 + length:]
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((status, body))

    def connection_lost(self, exc) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)


@dataclass
class InvokeResult:
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)


async def run_invokes(target: Target, event: dict, concurrency: int, seconds: float,
                      requests: int | None = None) -> InvokeResult:
    """`concurrency` keep-alive workers send requests back to back for `seconds`, or until
    `requests` have been answered when given (a fixed load, for CPU time per request)."""
    loop = asyncio.get_running_loop()
    body = json.dumps(event).encode()
    expected = json.loads(body)
    req = _request(target, target.echo_path, body, keep_alive=True, sse=False)
    result = InvokeResult()
    protos = [(await loop.create_connection(_KeepAliveProtocol, target.host, target.port))[1]
              for _ in range(concurrency)]
    start = time.perf_counter()
    stop_at = start + seconds
    budget = None if requests is None else [requests]  # requests not yet sent

    async def worker(proto: _KeepAliveProtocol) -> None:
        lat = result.latencies
        while True:
            t0 = time.perf_counter()
            if (t0 >= stop_at) if budget is None else budget[0] <= 0:
                return
            if budget is not None:
                budget[0] -= 1
            status, resp = await proto.request(req)
            lat.append(time.perf_counter() - t0)
            result.requests += 1
            if status != 200 or (result.requests % 997 == 0 and json.loads(resp) != expected):
                result.errors += 1

    await asyncio.gather(*(worker(p) for p in protos))
    result.seconds = time.perf_counter() - start
    for p in protos:
        p.transport.close()
    return result
