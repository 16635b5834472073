"""Flow control inside a worker: an invocation's credits and byte window, and its stream.

A write waits for a credit the frontend gives back once the write is in the invocation's bounded
channel, so a slow client slows its own handler and nothing else. Apart from the main loop
(child/main.py `ChildProgram`, which inherits `FlowControl`) because this is the backpressure contract
with runtime/process/worker_process.py, and reads best on its own.
"""
from __future__ import annotations

import abc
import asyncio
import ctypes
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...codec import WRITTEN, Written, encode_payload, encode_write
from ...errors import StreamBufferFullError, StreamClosedError
from ...surface import Mode
from ..protocol import Invoke, Item, ToFrontend, Write

__all__ = ("WINDOW_BYTES", "Cancelled", "FlowControl", "WorkerInvocation", "WorkerStream", "raise_in_thread",
           "resolve")

_get_ident = threading.get_ident
WINDOW_BYTES = 256 * 1024  # stream bytes one invocation may have in flight (besides the credit count)


class Cancelled(BaseException):
    """Raised inside the handler when the frontend cancels the invocation."""


class WorkerInvocation:
    """The invocation inside the worker: what `Context` needs (satisfies HandlerInvocation), plus its
    credits and cancel state."""

    def __init__(self, msg: Invoke, worker: FlowControl) -> None:
        self.id: str = msg["id"]
        self.trace_id: str = msg["trace_id"]
        self.event = msg["event"]
        self.streaming: bool = msg["streaming"]
        self.mode: Mode = "sse" if self.streaming else "json"  # raw framing is the frontend's concern
        self.items: bool = msg.get("items", False)  # a job's: generator items go as values, not writes
        self._worker = worker
        self.started = time.monotonic()
        self.deadline = self.started + float(msg["timeout"])
        self.max_write_size: int = msg["max_write_size"]
        self.session_id: str | None = msg["session_id"]
        self.session_restarted: bool = msg["session_restarted"]
        self.cancel_reason: str | None = None
        self.credits = worker.max_credits
        self.unacked: deque[int] = deque()  # sizes of the writes sent and not yet credited back
        self.unacked_bytes = 0
        self.task: asyncio.Task[Any] | None = None       # async handlers
        self.thread: int | None = None                    # def handlers: the thread running it
        self.cancellable = False
        self.interrupted = False                          # Cancelled was raised in its thread
        self.credit_waiter: asyncio.Future[None] | None = None
        self.pending: asyncio.Task[None] | None = None    # an async write waiting for a credit
        self.stream = WorkerStream(self, worker)

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def cancel(self, reason: str) -> None:
        self._worker._cancel(self.id, reason)

    def take_credit(self, size: int) -> bool:
        """Called with the worker's lock held: room for one more write of `size` in flight?

        At most `credits` writes and WINDOW_BYTES bytes (one larger write alone) unacknowledged.
        """
        if self.credits <= 0 or (self.unacked_bytes and self.unacked_bytes + size > WINDOW_BYTES):
            return False
        self.credits -= 1
        self.unacked.append(size)
        self.unacked_bytes += size
        return True

    def give_credits(self, n: int) -> None:
        self.credits += n
        if n >= len(self.unacked):  # the frontend took every write in flight (the usual case)
            self.unacked.clear()
            self.unacked_bytes = 0
            return
        for _ in range(n):
            self.unacked_bytes -= self.unacked.popleft()


class WorkerStream:
    """`context.get_stream()` in a worker: same contract as the in-process StreamWriter.

    A write waits while its invocation has no credit left, i.e. while the frontend has not yet
    put the earlier writes into the invocation's bounded channel (the client is slow): a thread
    blocks; on the loop `write` returns an awaitable, and a second write not awaited is refused.
    """

    __slots__ = ("_inv", "_worker", "max_write_size")

    def __init__(self, inv: WorkerInvocation, worker: FlowControl) -> None:
        self._inv = inv
        self._worker = worker
        self.max_write_size = inv.max_write_size

    def set_max_write_size(self, size: int) -> None:
        self.max_write_size = int(size)

    def write(self, data: Any) -> Written | asyncio.Task[None]:
        payload = encode_write(data, self.max_write_size)
        inv = self._inv
        if not inv.streaming:
            if inv.cancel_reason is not None:
                raise StreamClosedError(f"stream closed: {inv.cancel_reason}")
            return WRITTEN  # a plain JSON request has no stream; writes are dropped as in-process
        return self._worker.write(inv, payload)

    async def flush(self) -> None:
        """Wait for a last write the handler did not await."""
        if self._inv.pending is not None:
            await self._inv.pending


def raise_in_thread(ident: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in thread `ident` at its next bytecode (None: withdraw a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None)


class FlowControl(abc.ABC):
    """Sending an invocation's writes and items as its credits allow (the worker's output half)."""

    loop: asyncio.AbstractEventLoop
    # The thread that runs `loop` (the worker's main thread): a write compares thread ids to know
    # where it runs (asyncio's running-loop lookup is a getpid() system call per write).
    loop_thread: int
    max_credits: int
    post: Callable[[ToFrontend], None]
    post_write: Callable[[str, str], None]  # a handler thread's stream write (Outbox.post_write)
    _lock: threading.RLock
    _cond: threading.Condition  # over `_lock`
    _invs: dict[str, WorkerInvocation]

    @abc.abstractmethod
    def _cancel(self, inv_id: str, reason: str) -> None:
        """Cancel one invocation (the frontend asked, or its stream closed)."""

    def write(self, inv: WorkerInvocation, payload: str) -> Written | asyncio.Task[None]:
        """Send one stream write (its JSON text) once its invocation has a credit: `output`, with
        what a handler thread's every write would ask of it decided once."""
        if _get_ident() == self.loop_thread:
            return self.output(inv, "write", payload)
        self._take_credit_blocking(inv, len(payload))
        self.post_write(inv.id, payload)
        return WRITTEN

    def output(self, inv: WorkerInvocation, kind: str, value: Any) -> Written | asyncio.Task[None]:
        """Send one write or item once its invocation has a credit (backpressure from the client)."""
        frame: Write | Item = ({"t": "write", "id": inv.id, "p": [value]} if kind == "write"
                               else {"t": "item", "id": inv.id, "v": [value]})
        size = len(value) if isinstance(value, str) else len(encode_payload(value))
        if _get_ident() == self.loop_thread:
            if inv.pending is not None and not inv.pending.done():
                raise StreamBufferFullError("stream buffer is full: use `await context.get_stream().write(...)` "
                                            "in async handlers so the writer waits for the client")
            with self._cond:
                self._check_open(inv)
                if inv.take_credit(size):
                    self.post(frame)
                    return WRITTEN
            inv.pending = self.loop.create_task(self._output_when_credited(inv, frame, size))
            return inv.pending
        self._take_credit_blocking(inv, size)
        self.post(frame)
        return WRITTEN

    def _take_credit_blocking(self, inv: WorkerInvocation, size: int) -> None:
        """In a handler thread: take a credit for a write of `size`, waiting while there is none
        (take_credit inlined, the lock taken directly: a thread's every write passes here)."""
        with self._lock:
            while (inv.cancel_reason is not None or inv.credits <= 0
                   or (inv.unacked_bytes and inv.unacked_bytes + size > WINDOW_BYTES)):
                self._check_open(inv)
                if not self._cond.wait(timeout=max(inv.remaining(), 0.001)) and inv.remaining() <= 0:
                    raise StreamClosedError("stream write timed out: the client is not reading")
            inv.credits -= 1
            inv.unacked.append(size)
            inv.unacked_bytes += size

    @staticmethod
    def _check_open(inv: WorkerInvocation) -> None:
        if inv.cancel_reason is not None:
            raise StreamClosedError(f"stream closed: {inv.cancel_reason}")

    async def _output_when_credited(self, inv: WorkerInvocation, frame: Write | Item, size: int) -> None:
        while True:
            with self._cond:
                self._check_open(inv)
                if inv.take_credit(size):
                    self.post(frame)
                    return
                inv.credit_waiter = waiter = self.loop.create_future()
            try:
                await asyncio.wait_for(waiter, max(inv.remaining(), 0.001))
            except TimeoutError:
                raise StreamClosedError("stream write timed out: the client is not reading") from None
            finally:
                inv.credit_waiter = None

    def _on_credit(self, inv_id: str, n: int) -> None:
        """Reader thread: give credits back; wake the writers waiting for one."""
        with self._lock:
            inv = self._invs.get(inv_id)
            if inv is None:
                return
            inv.give_credits(n)
            self._cond.notify_all()
            waiter = inv.credit_waiter
        if waiter is not None:
            self.loop.call_soon_threadsafe(resolve, waiter, None)

    def _item_blocking(self, inv: WorkerInvocation, item: Any) -> None:
        self._item(inv, item)  # off the loop a write waits for its credit itself

    def _item(self, inv: WorkerInvocation, item: Any) -> Written | asyncio.Task[None]:
        if inv.streaming and not inv.items:
            return inv.stream.write(item)
        payload = encode_payload(item)
        value = payload if isinstance(item, (str, bytes, bytearray, memoryview)) else json.loads(payload)
        return self.output(inv, "item", value)


def resolve(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)
