"""Slot scheduling of a worker pool: who gets which free slot, who waits, and sessions' pinning.

Split from the pool's lifecycle (start, scale, replace, stop: runtime/process/pool.py) because the
rules here — a freed slot goes straight to the oldest waiter that can use it, a session waits for
its own worker, exclusive sessions never own every instance — are the part that changes with
load and sessions, and read best on their own. `WorkerPool` inherits them; all state is the pool's
and is touched with its lock held.
"""
from __future__ import annotations

import abc
import asyncio
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..errors import ConcurrencyLimitError, FunctionServiceError
from ..manifest import FunctionSpec
from ..threadpool import call_threadsafe
from .budget import WorkerBudget
from .errors import WorkerUnavailableError
from .protocol import Invoke
from .worker_process import PooledCall, WorkerProcess

if TYPE_CHECKING:
    from ..sessions import Session
    from ..surface import PooledInvocation

__all__ = ("SlotScheduler",)

log = logging.getLogger("fnstream.process")


class _Waiter:
    __slots__ = ("future", "loop", "session")

    def __init__(self, loop: asyncio.AbstractEventLoop, session: Session | None) -> None:
        self.loop = loop
        self.future: asyncio.Future[tuple[WorkerProcess, bool]] = loop.create_future()
        self.session = session



class SlotScheduler(abc.ABC):
    """Hands out the slots of a pool's workers and takes them back (WorkerPool's scheduling half)."""

    spec: FunctionSpec
    lock: threading.Lock
    workers: list[WorkerProcess]
    _waiters: deque[_Waiter]
    max_instances: int
    budget: WorkerBudget
    broken: str | None
    stopping: bool
    sessions_moved: int
    exclusive_lost: int

    @property
    def name(self) -> str:
        return self.spec.name

    @abc.abstractmethod
    def _maybe_scale_up(self) -> None:
        """Called with the lock held: one more worker when invocations wait (the pool's scaling)."""

    def _gives_way(self, worker: WorkerProcess) -> bool:
        """Called with the lock held, `worker` idle after a call: should it exit to make room?"""
        return False

    @abc.abstractmethod
    def _live(self) -> list[WorkerProcess]:
        """Called with the lock held: workers that serve or will serve."""

    def _possible_instances(self) -> int:
        """Called with the lock held: the instances the function can have now — maxInstances, or
        fewer when the node's cap (runtime.maxWorkerProcesses) leaves no room for more."""
        room = self.budget.room_for(self)
        return self.max_instances if room == float("inf") else min(self.max_instances,
                                                                   len(self._live()) + int(room))

    async def acquire(self, session: Session | None = None) -> tuple[WorkerProcess, bool]:
        """A slot on a worker (the session's own, if pinned) and whether the session restarted.

        Waits while every slot is taken; raises WorkerUnavailableError when none ever will be.
        """
        loop = asyncio.get_running_loop()
        with self.lock:
            self._check_usable()
            if session is not None and session.exclusive and session.worker is None \
                    and not self._exclusive_share_left(session):
                possible = self._possible_instances()
                raise ConcurrencyLimitError(
                    f"function {self.name!r}: exclusive sessions may own at most {possible - 1} of the "
                    f"{possible} instance(s) it can have now, one always stays shared; all are owned"
                    if possible > 1 else
                    f"function {self.name!r} has one instance (maxInstances 1): an exclusive session "
                    "(concurrency -1) would lock every other caller out; raise maxInstances or use concurrency >= 1"
                    if self.max_instances <= 1 else
                    f"function {self.name!r} can have one instance now (maxInstances {self.max_instances}, but "
                    "the node's runtime.maxWorkerProcesses leaves no room for more): an exclusive session "
                    "(concurrency -1) would lock every other caller out; retry later or use concurrency >= 1")
            picked = self._pick(session)
            if picked is not None:
                return picked
            waiter = _Waiter(loop, session)
            self._waiters.append(waiter)
            self._maybe_scale_up()
        try:
            return await waiter.future
        except BaseException:
            fut = waiter.future
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result()[0], None)  # handed a slot just as we were cancelled
            else:
                with self.lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)  # if a slot is on its way, `_hand` gives it back
            raise

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise WorkerUnavailableError(self.broken)
        if self.stopping:
            raise WorkerUnavailableError(f"function {self.name!r} is being stopped")

    def _exclusive_share_left(self, session: Session) -> bool:
        """Called with the lock held: may `session` own one more worker? Exclusive sessions together own
        at most one fewer than the instances the function can have now (maxInstances, or fewer under
        the node's cap), so that one instance always serves everyone else: no session, whatever its
        TTL, starves the function's other callers (they scale out onto it instead)."""
        now = time.monotonic()
        owned = 0
        for worker in self.workers:
            if worker.exclusive is not None:
                worker.live_sessions(now)  # forgets an expired owner
            if worker.exclusive is not None and worker.exclusive is not session:
                owned += 1
        return owned < self._possible_instances() - 1

    def _share_if_starved(self) -> None:
        """Called with the lock held, when no worker will start (maxInstances, or the node's cap came
        down on the function since its sessions took their share): if every instance is owned by an
        exclusive session while others wait, the least busy one's session loses its exclusivity —
        it keeps its worker, others are placed there too — rather than starve them for its TTL."""
        if not any(w.session is None or not w.session.exclusive for w in self._waiters):
            return
        now = time.monotonic()
        owned = []
        for worker in self._live():
            if worker.exclusive is not None:
                worker.live_sessions(now)  # forgets an expired owner
            if worker.exclusive is None:
                return  # a shared instance: they wait for a slot on it, as at maxInstances
            owned.append(worker)
        if not owned:
            return
        worker = min(owned, key=lambda w: w.busy)
        session, worker.exclusive = worker.exclusive, None
        self.exclusive_lost += 1
        log.warning("function %s: session %r loses exclusive use of worker %d: the function can have no "
                    "other instance now (maxInstances %d, runtime.maxWorkerProcesses) and calls wait",
                    self.name, session.id if session is not None else None, worker.pid, self.max_instances)
        self._dispatch()

    def _pick(self, session: Session | None) -> tuple[WorkerProcess, bool] | None:
        """Called with the lock held: take a slot for `session` (or anyone) if one is free."""
        if session is not None and session.worker is not None:
            pinned: WorkerProcess = session.worker
            if pinned in self.workers and pinned.state == "ready":
                if pinned.free() <= 0:
                    return None  # the session waits for its own worker
                return self._take(pinned, session)
            session.restarted = True  # its worker died (or is going): continue on another, and say so
            self.sessions_moved += 1
            pinned.sessions.pop(session.id, None)
            if pinned.exclusive is session:
                pinned.exclusive = None
            session.worker = None
        best: WorkerProcess | None = None
        now = time.monotonic()
        for worker in self.workers:
            free = worker.free()
            if free <= 0:
                continue
            if worker.exclusive is not None:
                worker.live_sessions(now)  # forgets an expired owner
                if worker.exclusive is not None and worker.exclusive is not session:
                    continue  # owned by a live exclusive session
            if session is not None and session.exclusive and (worker.busy or worker.live_sessions(now)
                                                              or not self._exclusive_share_left(session)):
                continue
            if best is None or free > best.free():
                best = worker
        if best is None:
            return None
        return self._take(best, session)

    def _take(self, worker: WorkerProcess, session: Session | None) -> tuple[WorkerProcess, bool]:
        restarted = False
        worker.busy += 1
        if session is not None:
            session.placed = True
            if session.worker is not worker:
                session.worker = worker
                session.on_end.append(self._unpin)
                if session.exclusive:
                    worker.exclusive = session
            worker.sessions[session.id] = session
            restarted, session.restarted = session.restarted, False
        return worker, restarted

    def _unpin(self, session: Session) -> None:
        with self.lock:
            for worker in self.workers:
                if worker.sessions.get(session.id) is session:
                    del worker.sessions[session.id]
                if worker.exclusive is session:
                    worker.exclusive = None
            self._dispatch()

    def _dispatch(self) -> None:
        """Called with the lock held: hand free slots to waiters, oldest first."""
        if not self._waiters:
            return
        for waiter in list(self._waiters):
            if waiter.future.done():
                self._waiters.remove(waiter)
                continue
            picked = self._pick(waiter.session)
            if picked is None:
                if waiter.session is None:
                    break  # no free slot for anyone: later waiters wait too (pinned ones aside)
                continue
            self._waiters.remove(waiter)
            if asyncio._get_running_loop() is waiter.loop:
                waiter.future.set_result(picked)  # on its loop: not done (checked above), no hop
            else:
                call_threadsafe(waiter.loop, self._hand, waiter, picked)
        self._maybe_scale_up()

    def _hand(self, waiter: _Waiter, picked: tuple[WorkerProcess, bool]) -> None:
        """On the waiter's loop: give it the slot, or give the slot back if it stopped waiting."""
        if waiter.future.done():
            self.release(picked[0], None)
        else:
            waiter.future.set_result(picked)

    def _fail_waiters(self, error: FunctionServiceError) -> None:
        """Called with the lock held."""
        for waiter in self._waiters:
            call_threadsafe(waiter.loop, _fail, waiter.future, error)
        self._waiters.clear()

    def begin(self, worker: WorkerProcess, inv: PooledInvocation, session: Session | None = None,
              restarted: bool = False) -> tuple[PooledCall, Invoke]:
        """The job of `inv` on the slot it holds on `worker`, and the frame that starts it there."""
        job = PooledCall(inv)
        job.release_early = session is None  # a session's slot waits for its task (session.leave first)
        worker.jobs[inv.id] = job
        worker.invocations += 1
        frame: Invoke = {"t": "invoke", "id": inv.id, "trace_id": inv.trace_id, "event": inv.event,
                         "streaming": inv.streaming, "timeout": inv.remaining(),
                         "max_write_size": inv.max_write_size,
                         "session_id": session.id if session is not None else None, "session_restarted": restarted,
                         "items": inv.streaming and inv.keep_items}
        return job, frame

    def release(self, worker: WorkerProcess, job: PooledCall | None) -> None:
        """A slot on `worker` is free again: hand it on, or stop the worker if it should go."""
        stop = give_way = False
        with self.lock:
            if job is not None:
                if job.released:
                    return  # given back already, when its outcome arrived
                job.released = True
                if worker.jobs.get(job.inv.id) is job:
                    del worker.jobs[job.inv.id]
            worker.busy = max(0, worker.busy - 1)
            if worker.busy == 0:
                worker.idle_since = time.monotonic()
            if worker.state == "ready":
                if self.stopping and worker.busy == 0:
                    stop = True
                elif worker.busy == 0 and self._gives_way(worker):
                    worker.state = "stopping"  # a scale-out whose room another function waits for
                    give_way = True
                else:
                    self._dispatch()
        if stop:
            worker.stop()
        elif give_way:
            log.info("function %s: worker %d gives its room to a function waiting for one", self.name, worker.pid)
            if worker.send_soon({"t": "stop"}) is None:  # the socket is busy: never wait on the loop
                threading.Thread(target=worker.send, args=({"t": "stop"},), daemon=True).start()

    def only_job(self, worker: WorkerProcess, job: PooledCall) -> bool:
        """Whether `job` is the only invocation on `worker` (killing it then harms nobody else)."""
        with self.lock:
            return worker.busy <= 1 and list(worker.jobs.values()) in ([job], [])


def _fail(fut: asyncio.Future[Any], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)
