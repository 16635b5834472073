"""Runs invocations of `executor: process` functions on their pool's worker processes.

Same contract as the in-process executor: `start` takes the concurrency slot and sets
`inv.task`; writes arrive in `inv.channel`; the task returns the result or raises a
FunctionServiceError. What a process adds, per invocation even when a worker runs many:
- a timeout cancels that invocation; a `def` handler alone on its worker is killed at once (no
  handler outlives its timeout), any other handler that does not stop within `cancel_grace`
  seconds is killed with its worker, and the other invocations on it fail naming why;
- a cancel (client gone, session interrupted) interrupts the handler and kills the worker if it
  does not stop within `cancel_grace` seconds;
- a crash of the worker fails the invocations on it, and nothing else.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from ..deployment import Deployment
from ..errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError, InitializerError
from ..invocation import Invocation
from .pool import WorkerPool
from .worker_process import PooledCall, WorkerProcess

__all__ = ("ProcessExecutor",)

log = logging.getLogger("fnstream.process")


class ProcessExecutor:
    """Starts process invocations; holds the tasks that reap cancelled ones."""

    def __init__(self, cancel_grace: float = 2.0) -> None:
        self.cancel_grace = cancel_grace
        self._reapers: set[asyncio.Task[None]] = set()

    def start(self, inv: Invocation) -> asyncio.Task[Any]:
        """Take a concurrency slot (429 when full) and run the invocation in its own task."""
        if inv.deployment.pool is None:
            raise RuntimeError(f"function {inv.deployment.name!r} has no worker pool")
        inv.deployment.acquire()
        inv.task = inv.loop.create_task(self._run(inv), name=f"invocation-{inv.id}")
        return inv.task

    def defer(self, inv: Invocation, ended: Callable[[Invocation], None]) -> None:
        """`start` for a plain JSON call: take the concurrency slot, and run in the task that awaits
        `inv.outcome()` (no task of its own, one loop turn less); `ended(inv)` once it ran."""
        if inv.deployment.pool is None:
            raise RuntimeError(f"function {inv.deployment.name!r} has no worker pool")
        inv.deployment.acquire()
        inv.defer(functools.partial(self._run_deferred, ended=ended))

    async def _run_deferred(self, inv: Invocation, ended: Callable[[Invocation], None]) -> Any:
        inv.task = task = asyncio.current_task(inv.loop)
        try:
            return await self._run(inv)
        except asyncio.CancelledError:
            if inv.abort_error is not None and task is not None and inv.cancel_reason is not None:
                task.uncancel()  # fnstream stopped it (shutdown), not the caller's own cancel
                raise inv.abort_error from None
            raise
        finally:
            ended(inv)

    async def _run(self, inv: Invocation) -> Any:
        dep = inv.deployment
        pool = dep.pool
        assert pool is not None  # a process deployment has its pool from deploy on
        session = inv.session
        worker: WorkerProcess | None = None
        job: PooledCall | None = None
        in_session = False
        refused = False  # the pool refused the session a worker (an exclusive share): it leaves no entry
        handed_off = False  # a reaper task releases the worker slot and the concurrency slot
        try:
            timeout = asyncio.timeout(inv.remaining())
            try:
                async with timeout:
                    if session is not None:
                        await session.enter(inv)
                        in_session = True
                    try:
                        worker, inv.session_restarted = await pool.acquire(session)
                    except ConcurrencyLimitError:
                        refused = session is not None
                        raise
                    if pool.init_error is not None:
                        raise InitializerError(pool.init_error)
                    job, frame = pool.begin(worker, inv, session, inv.session_restarted)
                    # A one-slot worker gets one invoke per turn: straight out, no flush a turn later.
                    if not (worker.send_soon(frame) if worker.slots == 1 else worker.send_on_loop(frame)) \
                            and worker.state != "dead":
                        # A large event (or another sender holds the socket): never block the loop on it.
                        await asyncio.to_thread(worker.send, frame)
                    kind, value = await job.waiter
            except TimeoutError:
                if not timeout.expired():
                    raise
                reason = f"function {dep.name!r} timed out after {dep.spec.timeout:g} s"
                inv.expire(reason)
                if worker is not None and job is not None and not job.future.done():
                    handed_off = self._stop_timed_out(dep, pool, worker, job, reason)
                raise FunctionTimeoutError(reason) from None
            if kind == "error":
                raise value
            return value
        except asyncio.CancelledError:
            if worker is not None and job is not None and not job.future.done():
                worker.cancel(inv.id, inv.cancel_reason or "cancelled")
                self._reap_later(dep, pool, worker, job, "of being cancelled")
                handed_off = True
            raise
        except FunctionServiceError:
            dep.failures += 1
            raise
        finally:
            if in_session and session is not None:
                session.leave(inv)
                if refused:
                    dep.sessions.drop_refused(session)
            inv.close_output()  # (a JSON call never made its channel: none is made to be closed)
            if not handed_off:
                if worker is not None:
                    pool.release(worker, job)
                dep.release()

    def _stop_timed_out(self, dep: Deployment, pool: WorkerPool, worker: WorkerProcess, job: PooledCall,
                        reason: str) -> bool:
        """Stop an invocation past its deadline; True when a reaper now owns its slots."""
        if pool.kind in ("sync", "gen") and not pool.interrupts_threads and pool.only_job(worker, job):
            worker.kill(reason)  # a thread cannot be stopped, but a process can: nobody else is on it
            return False
        worker.cancel(job.inv.id, reason)
        self._reap_later(dep, pool, worker, job, "of timing out")
        return True

    def _reap_later(self, dep: Deployment, pool: WorkerPool, worker: WorkerProcess, job: PooledCall, why: str) -> None:
        task = asyncio.get_running_loop().create_task(self._reap(dep, pool, worker, job, why))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _reap(self, dep: Deployment, pool: WorkerPool, worker: WorkerProcess, job: PooledCall, why: str) -> None:
        """Wait for a cancelled handler to stop; kill its worker if it will not."""
        try:
            try:
                await asyncio.wait_for(asyncio.shield(job.future), self.cancel_grace)
            except TimeoutError:
                worker.kill(f"invocation {job.inv.id} did not stop within {self.cancel_grace:g} s {why}")
                await job.future  # resolved when the reader thread sees the worker die
        finally:
            pool.release(worker, job)
            dep.release()

    async def aclose(self) -> None:
        """Wait for the reapers of cancelled invocations (each ends within the grace)."""
        if self._reapers:
            await asyncio.gather(*self._reapers, return_exceptions=True)
