"""Start-up and shutdown of a node's runtime, shared by `fnstream serve` and `fnstream worker`.

Shutdown is one sequence, whatever the node: stop taking new work, let the invocations in
flight finish within the grace (then abort the rest), end the other open readers (REST
named-stream subscribers get `event: end`) once the invocations are done or at 80% of the grace,
close the process pools and run every preStop, then stop the thread pool. `Lifecycle` is that
sequence as an async context manager; it also runs the executor's loop-lag monitor meanwhile.
A `def` handler's thread cannot be stopped: `exit_after_shutdown` ends the process with status 1
(without joining it) when one was abandoned.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType

from .executor import Executor
from .fork_guard import end_descendants
from .registry import Registry

__all__ = ("Lifecycle", "wait_for_stop_signal", "exit_after_shutdown")

END_STREAMS_AT = 0.8  # of the grace: subscribers still get their `event: end` before the process goes

log = logging.getLogger("fnstream.runtime")


async def wait_for_stop_signal() -> None:
    """Return once SIGINT or SIGTERM arrives; the previous handlers are restored."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


class Lifecycle:
    """`async with Lifecycle(executor, registry, grace):` runs the node; leaving it shuts down.

    `drain()` may be called earlier (the HTTP server drains once its listener has stopped, before
    it waits for open responses); leaving the block then only closes what is left. `stop_intake`
    holds what stops new work from arriving (e.g. a cluster node's queue readers); it runs first.
    `end_streams` holds what ends readers that are not invocations (the frontend's named-stream
    subscribers): it runs once the invocations are done or at 80% of the grace, whichever is first.
    After `close`, `abandoned_threads` is how many handler threads were still running.
    """

    def __init__(self, executor: Executor, registry: Registry, grace: float, *,
                 stop_intake: Iterable[Callable[[], Awaitable[None]]] = (),
                 end_streams: Iterable[Callable[[], Awaitable[None]]] = ()) -> None:
        self.executor = executor
        self.registry = registry
        self.grace = grace
        self.stop_intake = tuple(stop_intake)
        self.end_streams = tuple(end_streams)
        self.abandoned_threads = 0
        self._drained: asyncio.Future[int] | None = None
        self._closed = False

    async def __aenter__(self) -> Lifecycle:
        self.executor.loop_monitor.start()  # logs event-loop stalls (runtime/limits.py)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def drain(self) -> int:
        """Stop taking work, then give in-flight invocations `grace` s; the number aborted after it."""
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                for stop in self.stop_intake:
                    try:
                        await stop()
                    except Exception:
                        log.exception("shutdown: stopping intake failed")
                invocations = asyncio.ensure_future(self.executor.drain(self.grace))
                await asyncio.wait([invocations], timeout=self.grace * END_STREAMS_AT)
                for end in self.end_streams:
                    try:
                        await end()
                    except Exception:
                        log.exception("shutdown: ending open streams failed")
                self._drained.set_result(await invocations)
            except BaseException as exc:
                self._drained.set_exception(exc)
                raise
        return await asyncio.shield(self._drained)

    async def close(self) -> None:
        """Drain (unless done), then close the process pools, run every preStop, stop the threads."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.drain()
        finally:
            await self.executor.loop_monitor.stop()
            # Worker processes: cancelled handlers are reaped, then every pool runs preStop and exits.
            await self.executor.aclose_runners()
            await self.registry.stop_workers()
            self.executor.shutdown()
            self.abandoned_threads = self.executor.abandoned_threads()


def exit_after_shutdown(abandoned_threads: int) -> int:
    """0 after a clean stop. Handler threads that would not stop cannot be joined (the interpreter
    would wait for them for ever at exit): say so, and leave at once with status 1. Child processes
    a handler left running end here too."""
    left = end_descendants()
    if left:
        log.warning("killed %d process(es) that handlers started and left running", left)
    if not abandoned_threads:
        return 0
    log.error("exiting with %d handler thread(s) still running: they were abandoned (a thread cannot be "
              "stopped; use 'executor: process' for code that must be stoppable)", abandoned_threads)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
