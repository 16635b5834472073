"""One invocation: the unit that flows from the frontend through an executor and back.

It owns the bounded output channel, the deadline and the cancel switch. How stream writes are
delivered depends on the response kind: SSE and raw responses read the channel; a plain JSON
response aggregates generator items (bounded by maxResponseSize) and drops context writes.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .channel import OutputChannel
from .codec import WRITTEN, Item, encode_payload, encode_result, encode_write
from .errors import (
    FunctionServiceError,
    ResponseTooLargeError,
    StreamBufferFullError,
    StreamClosedError,
)
from .invocation_ids import new_invocation_id, new_trace_id
from .surface import Mode, resolve_mode
from .tasks import retrieve

if TYPE_CHECKING:
    from .deployment import Deployment
    from .sessions import Session

__all__ = ("Invocation", "StreamWriter", "drain_generator")

log = logging.getLogger("fnstream.runtime")

_LAZY_LOCK = threading.Lock()  # guards the first use of a plain JSON call's channel

class Invocation:
    """A single call of a deployed function, run here (satisfies InvocationSurface and HandlerInvocation).

    `timeout` shortens the function's own (a job's policy); with `keep_items`, a streaming
    invocation's generator items reach the channel as `Item`s, keeping their values."""

    # Slots: an instance dict grows into a full dict (~0.75 KB) the moment any attribute is set
    # that __init__ did not set (the task, the stream writer), which every invocation did, and
    # every open stream kept.
    __slots__ = ("__weakref__", "_aggregate_bytes", "_buffer_bytes", "_buffer_events", "_channel", "_deferred",
                 "_output_closed", "_stream", "abort_error", "aggregate", "cancel_reason", "deadline",
                 "deployment", "entered", "event", "id", "keep_items", "loop", "max_response_size",
                 "max_write_size", "mode", "session", "session_restarted", "spec", "started", "task", "timed_out",
                 "trace_id")

    def __init__(self, deployment: Deployment, event: Any, *, mode: Mode, loop: asyncio.AbstractEventLoop,
                 buffer_events: int = 100, max_write_size: int = 4 * 1024 * 1024,
                 max_response_size: int = 6 * 1024 * 1024, trace_id: str | None = None,
                 timeout: float | None = None, keep_items: bool = False, buffer_bytes: int | None = None,
                 invocation_id: str | None = None) -> None:
        self.id = invocation_id or new_invocation_id()
        self.trace_id = trace_id or new_trace_id()
        self.deployment = deployment
        spec = self.spec = deployment.spec
        self.event = event
        self.mode: Mode = resolve_mode(mode, spec)
        self.loop = loop
        self.started = started = time.monotonic()
        self.deadline = started + (spec.timeout if timeout is None else min(timeout, spec.timeout))
        self.keep_items = keep_items
        # The channel and the writer are made on first use: a plain JSON call whose handler never
        # calls `context.get_stream()` needs neither (see `channel`, `stream`).
        self._buffer_events = buffer_events
        self._buffer_bytes = buffer_bytes
        self._channel: OutputChannel[str] | None = (
            None if mode == "json" else OutputChannel(loop, buffer_events, buffer_bytes))
        self.max_write_size = max_write_size
        self.max_response_size = max_response_size
        self.aggregate: list[Any] = [] if mode == "json" else _NO_ITEMS  # a plain JSON call's generator items
        self._aggregate_bytes = 0
        self._output_closed = False
        self._stream: StreamWriter | None = None
        self._deferred: Callable[[Invocation], Awaitable[Any]] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.cancel_reason: str | None = None
        self.abort_error: FunctionServiceError | None = None
        self.timed_out: str | None = None
        self.entered = False  # the executor's run of it began (its cleanup will run)
        self.session: Session | None = None  # X-Instance-Session (runtime/sessions.py)
        self.session_restarted = False        # the session's earlier instance died before this turn

    @property
    def streaming(self) -> bool:
        return self.mode != "json"

    @property
    def session_id(self) -> str | None:
        return self.session.id if self.session is not None else None

    @property
    def channel(self) -> OutputChannel[str]:
        """The bounded output (SSE and raw responses read it); made on first use."""
        channel = self._channel
        if channel is None:
            with _LAZY_LOCK:  # a thread handler's first get_stream() may race the loop's cancel
                channel = self._channel
                if channel is None:
                    channel = self._channel = OutputChannel(self.loop, self._buffer_events, self._buffer_bytes)
                    if self._output_closed:
                        channel.close()
        return channel

    @property
    def stream(self) -> StreamWriter:
        """`context.get_stream()`'s writer; made on first use."""
        stream = self._stream
        if stream is None:
            stream = self._stream = StreamWriter(self)
        return stream

    @property
    def has_stream(self) -> bool:
        """The handler asked for its stream (so writes may be pending)."""
        return self._stream is not None

    def close_output(self) -> None:
        """The invocation has finished: no more writes (the reader gets what is queued, then [])."""
        # Flag first, then look: `channel` stores the channel first, then looks at the flag, so
        # whichever comes second closes it.
        self._output_closed = True
        channel = self._channel
        if channel is not None:
            channel.close()

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def cancel(self, reason: str) -> None:
        """Stop the invocation: writers get StreamClosedError, an async handler is cancelled."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
            log.info("invocation %s of %s cancelled: %s", self.id, self.spec.name, reason)
        self.channel.cancel(reason)
        if self.task is not None:
            # Nobody awaits the task any more: retrieve its outcome so it is not reported as lost.
            self.task.add_done_callback(retrieve)
            if not self.task.done():
                self.task.cancel(reason)

    def abort(self, error: FunctionServiceError) -> None:
        """Stop the invocation on fnstream's side (e.g. shutdown); `outcome()` then raises `error`."""
        self.abort_error = error
        self.cancel(error.message)

    def defer(self, run: Callable[[Invocation], Awaitable[Any]]) -> None:
        """Run later, in the task that awaits `outcome()` (see Executor.start's `inline`); `run`
        raises `abort_error` itself when an abort cancels it."""
        self._deferred = run

    def outcome(self) -> Awaitable[Any]:
        """The handler's result; its error; or the abort error if fnstream stopped it.

        A deferred (inline) run is returned as it is, to be awaited in the caller's task: one
        coroutine less per plain JSON call; it answers an abort itself (Executor._run)."""
        run, self._deferred = self._deferred, None
        if run is not None:
            return run(self)
        return self._task_outcome()

    async def _task_outcome(self) -> Any:
        assert self.task is not None
        try:
            return await self.task
        except asyncio.CancelledError:
            if self.abort_error is None:
                raise
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # our own caller is being cancelled (the client left)
            raise self.abort_error from None

    def time_out(self, reason: str) -> None:
        """The deadline passed: close the output (a thread's later writes raise) and cancel the
        task, which the executor turns into FunctionTimeoutError."""
        if self.timed_out is not None or self.task is None or self.task.done():
            return
        self.timed_out = reason
        self.expire(reason)
        self.task.cancel(reason)

    def expire(self, reason: str) -> None:
        """The deadline passed: close the output so a thread handler's later writes raise; what it
        wrote in time still goes out (a client that leaves later cancels, which discards it)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.channel.cancel(reason, discard=False)

    async def encoded_result(self) -> str | None:
        """The outcome as JSON text (see InvocationSurface); generator items of a plain JSON call."""
        result = await self.outcome()
        if result is None:
            if self.mode == "json" and self.deployment.kind in ("gen", "asyncgen"):
                return encode_result(self.aggregate, self.max_response_size)
            if self.streaming:
                return None
        if self.mode == "raw":
            return None
        return encode_result(result, self.max_response_size)

    # -- generator items ---------------------------------------------------------------------
    def add_item_blocking(self, item: Any) -> None:
        if self.streaming:
            self.stream.write(Item.of(item) if self.keep_items else item)
        else:
            self._aggregate(item)

    async def add_item(self, item: Any) -> None:
        if self.streaming:
            await self.stream.write(Item.of(item) if self.keep_items else item)
        else:
            self._aggregate(item)

    def _aggregate(self, item: Any) -> None:
        if self.cancel_reason is not None:
            raise StreamClosedError(f"stream closed: {self.cancel_reason}")
        self._aggregate_bytes += len(encode_payload(item))
        if self._aggregate_bytes > self.max_response_size:
            raise ResponseTooLargeError(f"aggregated stream result exceeds {self.max_response_size} bytes")
        self.aggregate.append(item)


_NO_ITEMS: list[Any] = []  # what a streaming invocation aggregates: nothing (never appended to)


class StreamWriter:
    """`context.get_stream()`: each write is one event, delivered at once to an SSE client.

    From a thread, `write` blocks while the buffer is full. On the event loop, `write` returns an
    awaitable: `await stream.write(x)` waits for room; a write not awaited while the buffer was
    full is refused at the next write, so memory stays bounded either way.
    """

    __slots__ = ("_channel", "_inv", "_loop", "_pending", "_streaming", "max_write_size")

    def __init__(self, invocation: Invocation) -> None:
        # Weak: the invocation holds its writer, and a reference cycle would leave every finished
        # invocation (task, channel, context...) to the cyclic garbage collector. What a write
        # needs after the invocation is gone (its channel, mode, loop) is held directly.
        self._inv = weakref.ref(invocation)
        self._channel = invocation.channel
        self._loop = invocation.loop
        self._streaming = invocation.streaming
        # Per task: each task of a handler may have one write waiting for room (several coroutines
        # of one handler may each `await stream.write()`); a second un-awaited write is refused.
        self._pending: dict[asyncio.Task[Any] | None, asyncio.Future[Any]] | None = None
        self.max_write_size = invocation.max_write_size

    def set_max_write_size(self, size: int) -> None:
        self.max_write_size = int(size)

    def write(self, data: Any) -> Awaitable[None]:
        payload = encode_write(data, self.max_write_size)
        channel = self._channel
        if not self._streaming:
            # The channel carries the invocation's cancel reason (cancel and expire set both).
            if channel.cancel_reason is not None:
                raise StreamClosedError(f"stream closed: {channel.cancel_reason}")
            return WRITTEN  # a plain JSON request has no stream; writes are dropped as in openYuanrong
        if channel.on_loop():
            waiting = self._pending
            if waiting:  # (the task is looked up only when one of the handler's writes waits)
                pending = waiting.get(asyncio.current_task(self._loop))
                if pending is not None and not pending.done():
                    raise StreamBufferFullError("stream buffer is full: use `await context.get_stream().write(...)` "
                                                "in async handlers so the writer waits for the client")
            if channel.try_put(payload):
                return WRITTEN
            task = asyncio.current_task(self._loop)
            if self._pending is None:
                self._pending = {}
            pending = self._pending[task] = asyncio.ensure_future(channel.put(payload))
            pending.add_done_callback(functools.partial(self._write_done, task))
            return pending
        inv = self._inv()  # None only once the invocation ended: its channel is closed and refuses
        channel.put_blocking(payload, timeout=max(inv.remaining(), 0.001) if inv is not None else 0.001)
        return WRITTEN

    async def flush(self) -> None:
        """Wait for a write made on the loop and not awaited (the handler has returned: its event
        must go out before the channel closes, or the write would fail against the closed channel)."""
        for pending in list(self._pending.values()) if self._pending else ():
            await pending

    def _write_done(self, task: asyncio.Task[Any] | None, future: asyncio.Future[Any]) -> None:
        if self._pending is not None and self._pending.get(task) is future:
            del self._pending[task]


def drain_generator(gen: Any, add_item: Callable[[Any], None]) -> Any:
    """Feed each item of a sync generator handler to `add_item`; return the generator's return value.

    The generator is closed on any exit, so its `finally` blocks run when a write raises.
    """
    with contextlib.closing(gen):
        while True:
            try:
                item = next(gen)
            except StopIteration as stop:
                return stop.value
            add_item(item)
