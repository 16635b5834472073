"""Start-up and shutdown of a node's runtime, shared by `fnstream serve` and `fnstream worker`.

Shutdown is one sequence, whatever the node: stop taking new work, let the invocations in
flight finish within the grace (then abort the rest), close the process pools and run every
preStop, then stop the thread pool. `Lifecycle` is that sequence as an async context manager.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from types import TracebackType

from .executor import Executor
from .registry import Registry

__all__ = ("Lifecycle", "wait_for_stop_signal")

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
    """

    def __init__(self, executor: Executor, registry: Registry, grace: float) -> None:
        self.executor = executor
        self.registry = registry
        self.grace = grace
        self.stop_intake: list[Callable[[], Awaitable[None]]] = []
        self._drained: asyncio.Future[int] | None = None
        self._closed = False

    async def __aenter__(self) -> Lifecycle:
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
                self._drained.set_result(await self.executor.drain(self.grace))
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
            # Worker processes: cancelled handlers are reaped, then every pool runs preStop and exits.
            await self.executor.process.aclose()
            await self.registry.stop_workers(self.grace)
            self.executor.shutdown()
