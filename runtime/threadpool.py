"""A bounded thread pool for `def` handlers whose threads never hold the process open.

`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits, so one
handler that never returns (`while True:` in a `def` handler) would keep every process that runs
the runtime — a test session, a script embedding the app — from ever exiting. A thread cannot be
killed, and the process must still be able to end: these threads are daemons. Threads start on
demand up to `max_workers` and an idle one is reused first, as in ThreadPoolExecutor.
"""
from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from .fork_guard import lasting_thread

__all__ = ("DaemonThreadPool", "call_threadsafe", "settle")

P = ParamSpec("P")
T = TypeVar("T")

# What gets a call's outcome: `deliver(result, None)` or `deliver(None, exc)`.
Deliver = Callable[[Any, BaseException | None], object]
# (function, its arguments, what gets its outcome, and the loop `deliver` runs on: None to run it in
# the pool thread; no deliver for a call whose outcome nobody wants). A plain tuple: no closure or
# partial per call.
_Work = tuple[Callable[..., Any], tuple[Any, ...], "Deliver | None", "asyncio.AbstractEventLoop | None"]


class DaemonThreadPool(Executor):
    """At most `max_workers` daemon threads running submitted calls in order of submission."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._idle = 0  # threads done with their call, waiting for more (under _lock; a plain count,
        # not a threading.Semaphore: its Python-level Condition cost more than the rest of a hand-off)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        call = functools.partial(fn, **kwargs) if kwargs else fn
        self._put((_unless_cancelled, (future.set_running_or_notify_cancel, call, args),
                   functools.partial(_settle_concurrent, future), None))
        return future

    def run_soon(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., T], /, *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` in a pool thread; its outcome lands in an asyncio future of `loop`.

        What `loop.run_in_executor(pool, fn, *args)` gives, at a fraction of its cost per call: no
        concurrent Future (whose Condition alone costs more than the rest) chained to a second
        one, just one `call_soon_threadsafe` when the call returns.
        """
        future: asyncio.Future[T] = loop.create_future()
        self._put((_unless_cancelled, (_pending(future), fn, args), functools.partial(settle, future), loop))
        return future

    def run_then(self, loop: asyncio.AbstractEventLoop, deliver: Deliver, fn: Callable[..., Any], /,
                 *args: Any) -> None:
        """`fn(*args)` in a pool thread, then `deliver(result, None)` or `deliver(None, exc)` on `loop`
        (`exc` a CancelledError if the pool shut down before it ran): no future at all, for a caller
        that needs to know when the thread ends apart from its own (cancellable) wait for the result."""
        self._put((fn, args, deliver, loop))

    def call(self, fn: Callable[..., Any], /, *args: Any) -> None:
        """`fn(*args)` in a pool thread, its outcome wanted by nobody (`fn` reports it itself; what
        it raises is dropped): no future per call."""
        self._put((fn, args, None, None))

    def _put(self, work: _Work) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._work.put(work)
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._serve, name=f"{self._prefix}_{len(self._threads)}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)

    def _serve(self) -> None:
        lasting_thread()  # a handler's fork from here dies with the process (runtime/fork_guard.py)
        try:
            while (work := self._work.get()) is not None:
                fn, args, deliver, loop = work
                del work
                try:
                    result = fn(*args)
                except BaseException as exc:  # delivered to the caller, as ThreadPoolExecutor does
                    if deliver is not None:
                        _deliver(loop, deliver, None, exc)
                    del exc
                else:
                    if deliver is not None:
                        _deliver(loop, deliver, result, None)
                    del result
                del fn, args, deliver, loop  # drop the call's references while idle
                with self._lock:
                    self._idle += 1
        finally:
            lasting_thread(False)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; idle threads end. A thread still running its call is left to it."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        work = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if work is not None and work[2] is not None:
                        _deliver(work[3], work[2], None, asyncio.CancelledError())
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _deliver(loop: asyncio.AbstractEventLoop | None, deliver: Deliver, result: Any,
             exc: BaseException | None) -> None:
    if loop is None:
        deliver(result, exc)
    else:
        call_threadsafe(loop, deliver, result, exc)


def _unless_cancelled(start: Callable[[], bool], fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`fn(*args)` if `start()` says its future still waits for it (a benign race for an asyncio
    future, read from this thread: it may still run), else CancelledError (its deliver ignores it)."""
    if not start():
        raise asyncio.CancelledError
    return fn(*args)


def _pending(future: asyncio.Future[Any]) -> Callable[[], bool]:
    return lambda: not future.cancelled()


def _settle_concurrent(future: Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():  # cancelled before it ran
        return
    if exc is None:
        future.set_result(result)
    elif isinstance(exc, asyncio.CancelledError) and not future.running():  # the pool shut down first
        future.cancel()
    else:
        future.set_exception(exc)


def call_threadsafe(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: Any) -> None:
    """`loop.call_soon_threadsafe`, from a thread whose loop may have closed meanwhile."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the process is going away and nobody waits
        pass


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """Give `future` (if still pending) the outcome a `run_then` deliver got."""
    if exc is None:
        _set_result(future, result)
    elif isinstance(exc, asyncio.CancelledError):  # the pool shut down before it ran
        future.cancel()
    else:
        _set_exception(future, exc)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        if isinstance(exc, StopIteration):  # an asyncio future refuses it (TypeError) and would never end
            error = RuntimeError(f"the call raised {exc!r}")
            error.__cause__ = exc
            exc = error
        future.set_exception(exc)
