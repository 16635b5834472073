"""Stopping background tasks that may not stop when asked once.

redis-py (8.1) swallows a cancel that lands in some of its calls — a plain `SET` or a pipeline,
about one in ten in a tight loop: the call returns as if nothing happened and the task runs on
with its cancel request pending and no CancelledError left to raise. A background loop that goes
on after that never ends, and whoever awaits it (a store's `close()`, shutdown) waits for ever.
So loops that call Redis pass a `checkpoint()` each round, and owners stop their tasks with
`stop_tasks`, which asks again while it waits and gives up after a bound (saying so).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

__all__ = ("checkpoint", "stop_tasks", "retrieve")

log = logging.getLogger("fnstream.runtime")


def checkpoint() -> None:
    """Raise the CancelledError a callee swallowed, if this task was asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def stop_tasks(tasks: Iterable[asyncio.Task[Any] | asyncio.Future[Any] | None], what: str,
                     timeout: float = 5.0) -> None:
    """Cancel `tasks` and wait for them to end, cancelling again every 0.2 s (a cancel swallowed
    once is delivered at the task's next await); after `timeout` seconds leave the rest, logged."""
    given = [t for t in tasks if t is not None]
    for task in given:  # what they end with is theirs to have logged: retrieve it, now or when they end
        task.add_done_callback(retrieve)
    pending = {t for t in given if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            log.warning("%s: %d background task(s) did not stop within %g s: %s", what, len(pending), timeout,
                        ", ".join(sorted(t.get_name() if isinstance(t, asyncio.Task) else repr(t) for t in pending)))
            return
        _done, pending = await asyncio.wait(pending, timeout=min(0.2, left))


def retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback: take the outcome of a task or future nobody awaits, so that it is not
    reported as never retrieved."""
    if not task.cancelled():
        task.exception()
