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

# (function, its arguments, the future its outcome goes to, and that future's loop: None for a
# concurrent Future). A plain tuple: no closure or partial per call.
# The third is Any: a concurrent Future, an asyncio Future, run_then's callback, or None.
_Work = tuple[Callable[..., Any], tuple[Any, ...], Any,
              "asyncio.AbstractEventLoop | None"]


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
        self._put((functools.partial(fn, **kwargs) if kwargs else fn, args, future, None))
        return future

    def run_soon(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., T], /, *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` in a pool thread; its outcome lands in an asyncio future of `loop`.

        What `loop.run_in_executor(pool, fn, *args)` gives, at a fraction of its cost per call: no
        concurrent Future (whose Condition alone costs more than the rest) chained to a second
        one, just one `call_soon_threadsafe` when the call returns.
        """
        future: asyncio.Future[T] = loop.create_future()
        self._put((fn, args, future, loop))
        return future

    def run_then(self, loop: asyncio.AbstractEventLoop, done: Callable[[Any, BaseException | None], object],
                 fn: Callable[..., Any], /, *args: Any) -> None:
        """`fn(*args)` in a pool thread, then `done(result, None)` or `done(None, exc)` on `loop`: no
        future at all, for a caller that needs to know when the thread ends apart from its own
        (cancellable) wait for the result."""
        self._put((fn, args, done, loop))

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
                fn, args, future, loop = work
                del work
                if future is None:
                    _run_detached(fn, args)
                elif loop is None:
                    _run_to_future(future, fn, args)
                elif not isinstance(future, asyncio.Future):  # run_then's callback
                    _run_then(loop, future, fn, args)
                else:
                    _run_to_loop(loop, future, fn, args)
                del fn, args, future, loop  # drop the call's references while idle
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
                    if work is not None:
                        _fn, _args, future, loop = work
                        if loop is None and future is not None:
                            future.cancel()
                        elif loop is not None and isinstance(future, asyncio.Future):
                            call_threadsafe(loop, future.cancel)
                        elif loop is not None and future is not None:  # run_then's callback
                            call_threadsafe(loop, future, None, asyncio.CancelledError())
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _run_detached(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        fn(*args)
    except BaseException:  # nobody waits for it; the pool thread lives on)
        pass


def _run_to_future(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if future.set_running_or_notify_cancel():
        try:
            result = fn(*args)
        except BaseException as exc:  # delivered to the awaiting caller, as ThreadPoolExecutor does
            future.set_exception(exc)
        else:
            future.set_result(result)


def _run_to_loop(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], fn: Callable[..., Any],
                 args: tuple[Any, ...]) -> None:
    if future.cancelled():  # cancelled while it waited for a thread (a benign race: it may still run)
        return
    try:
        result = fn(*args)
    except BaseException as exc:  # delivered to the awaiting caller, as run_in_executor does
        call_threadsafe(loop, _set_exception, future, exc)
    else:
        call_threadsafe(loop, _set_result, future, result)


def _run_then(loop: asyncio.AbstractEventLoop, done: Callable[[Any, BaseException | None], object],
              fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        result = fn(*args)
    except BaseException as exc:  # delivered to the caller's callback
        call_threadsafe(loop, done, None, exc)
    else:
        call_threadsafe(loop, done, result, None)


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
    """Give `future` (if still pending) the outcome a `run_then` callback got."""
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
