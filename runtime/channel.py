"""The bounded output channel of one invocation: writers put, the response reads.

Writers are handler threads (blocking put) or coroutines on the loop (awaitable put); the single
reader is the HTTP response on the loop. Memory is bounded by `capacity` items and by `max_bytes`
(UTF-8 size of what is queued; one item larger than that still passes, alone). The reader takes
everything already queued in one batch, so the response can coalesce it into one socket write.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Generic, TypeVar

from .errors import StreamClosedError

__all__ = ("OutputChannel",)

T = TypeVar("T")
_get_ident = threading.get_ident


class OutputChannel(Generic[T]):
    """Bounded, single-reader, thread-safe queue with close (producer done) and cancel (reader gone)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int, max_bytes: int | None = None) -> None:
        self._loop = loop
        # The thread running `loop` (None: made elsewhere, unknown): whether a caller is on the loop
        # is then a thread id compared, not asyncio's running-loop lookup (a getpid() system call
        # each, and a RuntimeError raised and caught in a handler thread), on every write.
        self.loop_thread = threading.get_ident() if asyncio._get_running_loop() is loop else None
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._bytes = 0  # queued size, counted only with max_bytes
        self._items: list[T] = []  # swapped out whole by the reader; far smaller than a deque when idle
        self._lock = threading.Lock()
        # Made on first need: most channels never see a blocked writer, and every open stream
        # pays for what its channel holds.
        self._space: threading.Condition | None = None
        self._reader: asyncio.Future[None] | None = None
        self._async_writers: list[asyncio.Future[None]] = []
        self._closed = False
        self._cancel_reason: str | None = None

    # -- state -------------------------------------------------------------------------------
    @property
    def cancel_reason(self) -> str | None:
        return self._cancel_reason

    def on_loop(self) -> bool:
        """Whether the caller runs on the channel's loop (else: a handler thread)."""
        loop_thread = self.loop_thread
        return _get_ident() == loop_thread if loop_thread is not None else _on_loop(self._loop)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def queued_bytes(self) -> int:
        """UTF-8 size of what is queued (0 when the channel has no byte bound)."""
        return self._bytes

    def _check_writable(self) -> None:
        if self._cancel_reason is not None:
            raise StreamClosedError(f"stream closed: {self._cancel_reason}")
        if self._closed:
            raise StreamClosedError("stream closed: the invocation has finished")

    def _wake_reader(self) -> None:
        """Called with the lock held; wakes the reader on the loop thread."""
        reader = self._reader
        if reader is not None:
            self._reader = None
            if self.on_loop():
                _resolve(reader)
            else:
                self._loop.call_soon_threadsafe(_resolve, reader)

    def _room_for(self, size: int) -> bool:
        """Called with the lock held."""
        if len(self._items) >= self.capacity:
            return False
        return self.max_bytes is None or not self._items or self._bytes + size <= self.max_bytes

    def _append(self, item: T, size: int) -> None:
        self._items.append(item)
        self._bytes += size
        self._wake_reader()

    def _size(self, item: T) -> int:
        if self.max_bytes is None:
            return 0
        if isinstance(item, str):
            return len(item) if item.isascii() else len(item.encode("utf-8", "surrogatepass"))
        return len(item) if isinstance(item, (bytes, bytearray)) else 1

    # -- writers -----------------------------------------------------------------------------
    def try_put(self, item: T) -> bool:
        """Put without waiting; False when full. Raises StreamClosedError when closed."""
        size = self._size(item)
        with self._lock:
            self._check_writable()
            if not self._room_for(size):
                return False
            self._append(item, size)
            return True

    def try_put_many(self, items: list[T]) -> int:
        """`try_put` of each item in turn, under one lock and one wake-up of the reader: how many
        went in (the rest did not fit). Raises StreamClosedError when closed."""
        with self._lock:
            self._check_writable()
            queued = self._items
            room = self.capacity - len(queued)
            if room <= 0:
                return 0
            fitting = items if len(items) <= room else items[:room]
            if self.max_bytes is None:
                queued.extend(fitting)
                count = len(fitting)
            else:
                limit, total, count = self.max_bytes, self._bytes, 0
                for item in fitting:
                    size = self._size(item)
                    if queued and total + size > limit:
                        break
                    queued.append(item)
                    total += size
                    count += 1
                self._bytes = total
            if count:
                self._wake_reader()
            return count

    def put_blocking(self, item: T, timeout: float | None = None) -> None:
        """Put from a thread, waiting while the channel is full (backpressure)."""
        size = self._size(item)
        with self._lock:
            while True:
                self._check_writable()
                if self._room_for(size):
                    self._append(item, size)
                    return
                if self._space is None:
                    self._space = threading.Condition(self._lock)
                if not self._space.wait(timeout):
                    raise StreamClosedError("stream write timed out: the client is not reading")

    async def put(self, item: T) -> None:
        """Put from the loop, awaiting room."""
        while not self.try_put(item):
            waiter = self._loop.create_future()
            with self._lock:
                self._async_writers.append(waiter)
                if self._room_for(self._size(item)) or self._cancel_reason or self._closed:
                    _resolve(waiter)
            await waiter

    # -- reader ------------------------------------------------------------------------------
    async def get_batch(self) -> list[T]:
        """All queued items, waiting for at least one; [] once closed and drained.

        Raises TimeoutError when `interrupt_reader` woke it first (a heartbeat is due).
        """
        while (batch := self.take()) is None:
            await self.ready()
        return batch

    def take(self) -> list[T] | None:
        """All queued items now; [] once closed and drained; None when there is nothing yet
        (await `ready()`). `get_batch` without a coroutine, for a reader that is one itself
        (the SSE relay: one frame less for every open stream to hold)."""
        with self._lock:
            if self._items:
                batch = self._items
                self._items = []
                self._bytes = 0
                if self._space is not None:
                    self._space.notify_all()
                if self._async_writers:
                    for w in self._async_writers:
                        _resolve(w)
                    self._async_writers.clear()
                return batch
            if self._closed or self._cancel_reason is not None:
                return []
            return None

    def ready(self) -> asyncio.Future[None]:
        """Done once `take()` has something to give (items, or the end); raises TimeoutError when
        `interrupt_reader` wakes it first (a heartbeat is due)."""
        reader = self._loop.create_future()
        with self._lock:
            if self._items or self._closed or self._cancel_reason is not None:
                reader.set_result(None)  # it came between take() and now
            else:
                self._reader = reader
        return reader

    def interrupt_reader(self) -> bool:
        """Wake a waiting reader with TimeoutError (a heartbeat is due); False if none waits."""
        with self._lock:
            reader = self._reader
            if reader is None or reader.done():
                return False
            self._reader = None
            reader.set_exception(TimeoutError())
            return True

    # -- ends --------------------------------------------------------------------------------
    def close(self) -> None:
        """The producer is done: the reader drains what is left, then gets []."""
        with self._lock:
            self._closed = True
            self._wake_reader()

    def cancel(self, reason: str, *, discard: bool = True) -> None:
        """The reader is gone (or the deadline passed): writers get StreamClosedError.

        With `discard=False` (the deadline passed, the reader is still there) the reader still gets
        what was written before, then []."""
        with self._lock:
            if self._cancel_reason is None:
                self._cancel_reason = reason
            if discard:
                self._items.clear()
                self._bytes = 0
            if self._space is not None:
                self._space.notify_all()
            writers = list(self._async_writers)
            self._async_writers.clear()
            self._wake_reader()
        for w in writers:
            self._loop.call_soon_threadsafe(_resolve, w)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    return asyncio._get_running_loop() is loop  # (no RuntimeError raised and caught off the loop)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
