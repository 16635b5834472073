"""A plain call: one JSON invoke of an in-process `async def` or `def` handler, run in the request's
own task (`Executor.call_plain`), its result encoded once.

Most invokes are this: a function found by name, a JSON event in, a JSON result out, nothing read
while it runs. A general `Invocation` (runtime/invocation.py) carries what the other kinds need —
an output channel, mode resolution, generator items, sessions, a task of its own — and it cost
more per call than the HTTP server in front of it. A `PlainCall` keeps only the bookkeeping a
plain call still owes: its id, trace id, deadline (the executor's one watchdog times it out),
concurrency slot, cancel and abort (the client left; shutdown), and the stream a handler may ask
for (a plain JSON call's writes are dropped, as in openYuanrong, but raise once it is cancelled).
`Dispatcher.plain` decides which calls are plain; every other one goes through `dispatch`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from .codec import WRITTEN, encode_payload, encode_write
from .errors import FunctionServiceError, ResponseTooLargeError, StreamClosedError
from .invocation_ids import new_invocation_id
from .surface import Mode

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .deployment import Deployment

__all__ = ("PlainCall", "PlainStream")

log = logging.getLogger("fnstream.runtime")


class PlainCall:
    """A plain JSON call of a deployed function, run in its caller's task (satisfies
    HandlerInvocation for `Context`, and what the executor's watchdog and drain need)."""

    __slots__ = ("_aggregate_bytes", "_stream", "abort_error", "cancel_reason", "deadline", "deployment", "event",
                 "id", "max_response_size", "max_write_size", "spec", "started", "task", "timed_out", "trace_id")

    mode: Mode = "json"
    streaming = False
    keep_items = False
    session = None
    session_id = None
    session_restarted = False

    def __init__(self, deployment: Deployment, event: Any, trace_id: str, max_write_size: int,
                 max_response_size: int) -> None:
        self.id = new_invocation_id()
        self.trace_id = trace_id
        self.deployment = deployment
        spec = self.spec = deployment.spec
        self.event = event
        self.started = started = time.monotonic()
        self.deadline = started + spec.timeout
        self.max_write_size = max_write_size
        self.max_response_size = max_response_size
        self.task: asyncio.Task[Any] | None = None  # the caller's, once the handler runs
        self.cancel_reason: str | None = None
        self.abort_error: FunctionServiceError | None = None
        self.timed_out: str | None = None
        self._stream: PlainStream | None = None
        self._aggregate_bytes = 0

    @property
    def stream(self) -> PlainStream:
        """`context.get_stream()`: writes are checked, then dropped (a plain JSON call has no stream)."""
        stream = self._stream
        if stream is None:
            stream = self._stream = PlainStream(self)
        return stream

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def cancel(self, reason: str) -> None:
        """Stop the call: its writes raise StreamClosedError, its handler (in its caller's task) is cancelled."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
            log.info("invocation %s of %s cancelled: %s", self.id, self.spec.name, reason)
        task = self.task
        if task is not None and not task.done() and task is not _current_task():
            task.cancel(reason)

    def abort(self, error: FunctionServiceError) -> None:
        """Stop it on fnstream's side (shutdown): the call then raises `error`."""
        self.abort_error = error
        self.cancel(error.message)

    def time_out(self, reason: str) -> None:
        """The deadline passed (the executor's watchdog): the call raises FunctionTimeoutError."""
        if self.timed_out is not None or self.task is None or self.task.done():
            return
        self.timed_out = reason
        if self.cancel_reason is None:
            self.cancel_reason = reason  # a thread handler's later writes raise
        self.task.cancel(reason)

    def add_item_blocking(self, item: Any) -> None:
        """An item of the generator a `def` handler returned: bounded and dropped, as a plain JSON
        call of a general Invocation does (its answer is the handler's return value)."""
        if self.cancel_reason is not None:
            raise StreamClosedError(f"stream closed: {self.cancel_reason}")
        self._aggregate_bytes += len(encode_payload(item))
        if self._aggregate_bytes > self.max_response_size:
            raise ResponseTooLargeError(f"aggregated stream result exceeds {self.max_response_size} bytes")


class PlainStream:
    """The stream of a plain JSON call: a write is encoded (so a write that could not go out fails
    as on a stream) and dropped; once the call is cancelled or timed out, writes raise."""

    __slots__ = ("_call", "max_write_size")

    def __init__(self, call: PlainCall) -> None:
        self._call = call
        self.max_write_size = call.max_write_size

    def set_max_write_size(self, size: int) -> None:
        self.max_write_size = int(size)

    def write(self, data: Any) -> Awaitable[None]:
        encode_write(data, self.max_write_size)
        reason = self._call.cancel_reason
        if reason is not None:
            raise StreamClosedError(f"stream closed: {reason}")
        return WRITTEN


_current_task = asyncio.current_task
