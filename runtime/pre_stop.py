"""Running the manifest's `preStop` of an in-process (thread or async) deployment.

Worker processes run their own preStop (runtime/process/child/main.py); this is the same hook for
deployments whose code lives in the server. It runs once, with an initializer-style Context,
within min(timeout, 180 s (openYuanrong's cap on pre_stop), the node's preStopGraceSeconds), and
whatever it raises is logged: a broken preStop must never take the server down or hold up a
shutdown past its preStop grace.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from .manifest import FunctionSpec

__all__ = ("run_pre_stop", "pre_stop_timeout", "MAX_PRE_STOP_SECONDS")

log = logging.getLogger("fnstream.runtime")

MAX_PRE_STOP_SECONDS = 180.0


def pre_stop_timeout(spec: FunctionSpec, grace: float | None = None) -> float:
    """A preStop's time: its function's `timeout`, at most 180 s and the node's preStop `grace`."""
    timeout = min(float(spec.timeout), MAX_PRE_STOP_SECONDS)
    return timeout if grace is None else min(timeout, grace)


def _in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run `fn` in its own daemon thread: one that overruns its timeout cannot block the exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:
            outcome = (False, exc)
        else:
            outcome = (True, result)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    threading.Thread(target=target, name=f"fnstream-prestop-{getattr(fn, '__name__', 'fn')}", daemon=True).start()
    return future


async def run_pre_stop(spec: FunctionSpec, pre_stop: Callable[..., Any], revision: int,
                       grace: float | None = None) -> None:
    """Run the `pre_stop` hook of `spec` (the caller runs it once) within pre_stop_timeout(spec,
    grace); log, never raise, what it does wrong."""
    from .context import Context

    ctx = Context(spec)
    timeout = pre_stop_timeout(spec, grace)
    try:
        if inspect.iscoroutinefunction(pre_stop):
            await asyncio.wait_for(pre_stop(ctx), timeout)
        else:
            await asyncio.wait_for(_in_daemon_thread(lambda: pre_stop(ctx)), timeout)
    except TimeoutError:
        log.error("function %s: preStop did not finish within %g s; going on without it", spec.name, timeout)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        log.error("function %s: preStop failed: %s: %s", spec.name, type(exc).__name__, exc, exc_info=exc)
    else:
        log.info("function %s: preStop ran (revision %d)", spec.name, revision)
