"""Stopping a `def` handler's thread that ran past its timeout.

A Python thread cannot be killed, but CPython can raise an exception in it at its next bytecode
(`PyThreadState_SetAsyncExc`): a handler spinning in pure Python (`while True: pass`) ends there,
instead of holding the GIL, a share of the function's threads and the loop's latency for good. A
thread blocked in C (`time.sleep`, a socket read) holds no GIL and sees it when the call returns.

The exception must only ever land in the invocation it was meant for, never in the pool's own code
or the thread's next invocation. `run_stoppable` records which invocation a thread runs; the
stopper raises only while that record holds, under a lock the thread takes to clear its record on
the way out, and the thread then withdraws any exception still pending (set just before it took the
lock). An exception that fires anywhere in between is inside `run_stoppable` and is caught there.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

__all__ = ("InvocationStopped", "run_stoppable", "stop_thread", "thread_running")


class InvocationStopped(BaseException):
    """Raised inside a handler's thread past its timeout. A BaseException, so that a handler's
    `except Exception:` does not swallow it (a bare `except:` can: the stopper then tries again)."""


_lock = threading.Lock()
_running: dict[int, object] = {}  # thread ident -> the invocation (any identity token) it runs
_stopped: set[int] = set()  # threads an exception was raised in, not yet withdrawn (under _lock)
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def run_stoppable(token: object, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in this thread, which `stop_thread(ident, token)` may stop (InvocationStopped)."""
    ident = threading.get_ident()
    _running[ident] = token
    try:
        try:
            return fn(*args)
        finally:
            _leave(ident, token)
    except InvocationStopped:
        if _running.get(ident) is token:  # it fired before _leave took the lock
            del _running[ident]
        raise


def _leave(ident: int, token: object) -> None:
    with _lock:
        if _running.get(ident) is token:
            del _running[ident]
        if ident in _stopped:  # (most calls were never stopped: no ctypes call for them)
            _stopped.discard(ident)
            _set_async_exc(ident, ctypes.py_object())  # NULL: withdraw an exception not yet raised


def stop_thread(ident: int, token: object) -> bool:
    """Raise InvocationStopped in thread `ident` if it still runs `token`; whether it was raised."""
    with _lock:
        if _running.get(ident) is not token:
            return False
        _stopped.add(ident)
        return bool(_set_async_exc(ident, ctypes.py_object(InvocationStopped)) == 1)


def thread_running(token: object) -> int:
    """The ident of the thread in `run_stoppable` for `token` now, or 0 (not yet, or no more)."""
    for ident, running in list(_running.items()):  # (a copy: other threads add and remove theirs)
        if running is token:
            return ident
    return 0
