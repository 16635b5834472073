"""Server-Sent Events framing and a lazily-prepared SSE response.

Framing follows the SSE spec: a payload with line breaks becomes several `data:` lines. The
response is prepared with the first bytes, so a failure before any event can still set the
status. Events already queued are written in one call (coalesced); a lone event is not delayed.
"""
from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from .tracing import trace_headers

if TYPE_CHECKING:
    from runtime.channel import OutputChannel

__all__ = ("encode_event", "encode_comment", "EventStream", "relay", "frame_raw", "SSE_HEADERS", "DONE_EVENT", "PING",
           "CURRENT_STREAM")

_LINE_BREAK = re.compile(r"\r\n|\r|\n")

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}
DONE_EVENT = b"data: [DONE]\n\n"
# A comment with no blank line after it: a blank line after a comment makes the openai-python
# parser emit an empty event once it has seen an `id:` (openai-python #2722, #3833).
PING = b": ping\n"
# The SSE answer a request is writing (read by frontend/metrics_counters.py for bytes, pings, first event).
CURRENT_STREAM = web.RequestKey("event_stream", object)


def encode_event(data: str, event_id: int | str | None = None, event: str | None = None) -> bytes:
    """One SSE event: optional `event:` and `id:` lines, `data:` lines, then a blank line."""
    head = ""
    if event is not None:
        head = f"event: {event}\n"
    if event_id is not None:
        head += f"id: {event_id}\n"
    if "\n" not in data and "\r" not in data:
        return f"{head}data: {data}\n\n".encode()
    lines = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    return f"{head}{lines}\n".encode()


def encode_comment(text: str) -> bytes:
    return "".join(f": {line}\n" for line in _LINE_BREAK.split(text)).encode()


def frame_raw(batch: list[str]) -> bytes:
    """Payloads verbatim: for handlers that frame their own SSE (`rawStream`)."""
    return "".join(batch).encode()


class _Beat:
    """One relayed stream's heartbeat: its channel, its period, and since when it has been quiet."""

    __slots__ = ("channel", "every", "quiet_since")

    def __init__(self, channel: OutputChannel[str], every: float) -> None:
        self.channel, self.every, self.quiet_since = channel, every, time.monotonic()


class _HeartbeatClock:
    """The heartbeats of every relayed stream on one loop, from one task.

    A timer per stream per batch (`get_batch(timeout=...)`) cost every batch of every stream a
    timer, and every idle stream the memory of one; the clock instead wakes, a few times per
    period, each stream quiet for a whole period (its reader gets TimeoutError and pings). A ping
    thus comes after `every` to `1.25 * every` seconds of quiet. The task ends with the last stream.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._beats: set[_Beat] = set()
        self._periods: dict[float, int] = {}  # period -> streams beating at it (a few distinct ones)
        self._tick = math.inf
        self._task: asyncio.Task[None] | None = None

    def join(self, channel: OutputChannel[str], every: float) -> _Beat:
        beat = _Beat(channel, every)
        self._beats.add(beat)
        self._periods[every] = self._periods.get(every, 0) + 1
        if every / 4 < self._tick:  # the first stream (no task: the tick is inf) or a faster one
            self._tick = every / 4
            if self._task is not None:
                self._task.cancel()  # restart with the shorter tick
            self._task = self.loop.create_task(self._run(), name="sse-heartbeats")
        return beat

    def leave(self, beat: _Beat) -> None:
        self._beats.discard(beat)
        left = self._periods[beat.every] - 1
        if left:
            self._periods[beat.every] = left
            return
        del self._periods[beat.every]
        if self._periods:  # the last stream of its period: tick at the pace of the rest
            self._tick = min(self._periods) / 4
            return
        task, self._task, self._tick = self._task, None, math.inf
        if task is not None and not self.loop.is_closed():
            task.cancel()  # nothing left to beat for: no task outlives the streams

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            now = time.monotonic()
            for beat in self._beats:
                if now - beat.quiet_since >= beat.every and beat.channel.interrupt_reader():
                    beat.quiet_since = now


_current_clock: _HeartbeatClock | None = None


def _clock() -> _HeartbeatClock:
    """The running loop's clock. One loop runs a server; when another loop asks (a new test's),
    it gets a new clock, and the old one lives on only as long as relays of its loop hold it
    (a map of loop to clock would keep a closed loop alive through the clock's task)."""
    global _current_clock
    loop = asyncio.get_running_loop()
    clock = _current_clock
    if clock is None or clock.loop is not loop:
        clock = _current_clock = _HeartbeatClock(loop)
    return clock


async def relay(stream: EventStream, channel: OutputChannel[str], heartbeat: float,
                frame: Callable[[list[str]], bytes], tee: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
    """Write each batch read from `channel` as one socket write, until the channel closes.

    A batch is everything queued since the last write (coalesced; a lone event is not delayed).
    After `heartbeat` seconds without one, a `: ping` comment keeps proxies from timing out.
    `tee` gets each batch before the socket does (runtime/durable.py keeps it): what the client
    saw is always kept, whenever it leaves.
    """
    clock = _clock()
    beat = clock.join(channel, heartbeat)
    try:
        while True:
            batch = channel.take()
            if batch is None:  # nothing yet: wait here, on the channel's future (no coroutine of its own)
                try:
                    await channel.ready()
                except TimeoutError:  # the clock: quiet for `heartbeat` seconds
                    await stream.ping()
                continue
            if not batch:
                return
            if stream.first_event_at is None:
                stream.first_event_at = time.monotonic()
            stream.events += len(batch)
            if tee is not None:
                await tee(batch)
            await stream.write(frame(batch))
            beat.quiet_since = time.monotonic()
    finally:
        clock.leave(beat)


class EventStream:
    """An SSE response whose headers go out with the first write (event, ping or end)."""

    # Slots: one of these per open stream, and thousands may idle at once.
    __slots__ = ("bytes_sent", "events", "first_event_at", "next_id", "opened_at", "pings", "prepared", "request",
                 "response")

    def __init__(self, request: web.BaseRequest, headers: dict[str, str] | None = None) -> None:
        self.request: web.BaseRequest | None = request  # until the response is prepared
        # Every header at once, the trace headers too: a header block that grows later holds more.
        own = {**SSE_HEADERS, **(headers or {})}
        own.update(trace_headers(request, own.get("X-Trace-Id")))
        self.response = web.StreamResponse(status=200, headers=own)
        self.prepared = False
        # Read by frontend/metrics_counters.py: what this response carried.
        self.events = 0
        self.bytes_sent = 0
        self.pings = 0
        self.opened_at = time.monotonic()
        self.first_event_at: float | None = None  # when relay() wrote the first event (metrics)
        self.next_id = 1  # the `id:` of the next event framed by `frame_with_ids`
        request[CURRENT_STREAM] = self

    def frame_with_ids(self, batch: list[str]) -> bytes:
        """A batch of payloads as events numbered on from `next_id` (a relay's `frame`)."""
        first = self.next_id
        self.next_id = first + len(batch)
        joined = "".join(batch)
        if "\n" not in joined and "\r" not in joined:  # one data: line each: framed in one pass
            return "".join([f"id: {i}\ndata: {payload}\n\n" for i, payload in enumerate(batch, first)]).encode()
        return b"".join([encode_event(payload, i) for i, payload in enumerate(batch, first)])

    def set_status(self, status: int) -> None:
        if self.prepared:
            raise RuntimeError("Cannot set the status after the first event was sent")
        self.response.set_status(status)

    async def write(self, data: bytes) -> None:
        if not self.prepared:
            await self._prepare()
        self.bytes_sent += len(data)
        await self.response.write(data)

    async def ping(self) -> None:
        self.pings += 1
        await self.write(PING)

    async def finish(self) -> web.StreamResponse:
        if not self.prepared:
            await self._prepare()
        await self.response.write_eof()
        return self.response

    async def _prepare(self) -> None:
        assert self.request is not None
        await self.response.prepare(self.request)
        self.prepared = True
        # The request holds this stream (CURRENT_STREAM, for metrics): a stream still holding the
        # request made every finished connection cyclic garbage — its request, protocol, task and
        # invocation, ~33 objects, left for the collector instead of freed as the connection closed.
        self.request = None
