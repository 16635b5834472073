"""Slot scheduling of a worker pool (runtime/process/scheduling.py SlotScheduler), without
processes: a pool of stand-in workers that have slots and states but no child program.

A slot goes to the worker with the most free slots; when none is free the caller waits, and a
freed slot goes to the oldest waiter that can use it; a session keeps its worker (and waits for
it), moves on and is told when that worker died; exclusive sessions own an idle worker each and
never all of them; a broken or stopping pool refuses; a stopping pool's idle worker stops.
The same rules with real worker processes: tests/runtime/process/test_instances.py.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque

import pytest

from runtime.errors import ConcurrencyLimitError
from runtime.manifest import FunctionSpec
from runtime.process.budget import WorkerBudget
from runtime.process.errors import WorkerUnavailableError
from runtime.process.scheduling import SlotScheduler
from runtime.process.worker_process import WorkerProcess
from runtime.sessions import Session, SessionRequest
from tests.support.servers import HANDLERS
from tests.support.waiting import eventually


class StandIn(WorkerProcess):
    """A worker with slots and a state, and no process behind it."""

    def __init__(self, pool: Pool, pid: int) -> None:  # no super(): nothing is launched
        self.pool = pool  # type: ignore[assignment]
        self.pid = pid
        self.state = "ready"
        self.busy = 0
        self.jobs = {}
        self.invocations = 0
        self.idle_since = 0.0
        self.sessions = {}
        self.exclusive = None
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def __repr__(self) -> str:
        return f"<worker {self.pid}>"


class Pool(SlotScheduler):
    def __init__(self, workers: int = 2, slots: int = 1, max_instances: int | None = None) -> None:
        self.spec = FunctionSpec.model_validate({"name": "f", "handler": "testfns.echo_sync",
                                                 "codePath": str(HANDLERS)})
        self.lock = threading.Lock()
        self.slots = slots
        self.workers = [StandIn(self, pid) for pid in range(1, workers + 1)]
        self._waiters = deque()
        self.max_instances = max_instances if max_instances is not None else workers
        self.broken = None
        self.stopping = False
        self.sessions_moved = 0
        self.exclusive_lost = 0
        self.budget = WorkerBudget()
        self.scale_ups = 0

    def _maybe_scale_up(self) -> None:
        if self._waiters:
            self.scale_ups += 1

    def _live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.state in ("starting", "ready")]


def session(sid: str, concurrency: int = 1, ttl: float = 600) -> Session:
    return Session(SessionRequest(sid, ttl, concurrency))


async def waiting(pool: Pool, n: int) -> None:
    await eventually(lambda: len(pool._waiters) == n, f"{n} caller(s) to wait")


async def test_a_slot_goes_to_the_worker_with_the_most_free_slots():
    pool = Pool(workers=2, slots=3)
    one, _ = await pool.acquire()
    two, _ = await pool.acquire()
    assert one is not two  # the second worker had more free slots
    three, _ = await pool.acquire()
    assert three.busy == 2 and {one.busy, two.busy} == {1, 2}
    pool.release(three, None)
    assert one.busy + two.busy == 2


async def test_a_freed_slot_goes_to_the_oldest_waiter():
    pool = Pool(workers=1, slots=1)
    worker, _ = await pool.acquire()
    first = asyncio.create_task(pool.acquire())
    await waiting(pool, 1)
    second = asyncio.create_task(pool.acquire())
    await waiting(pool, 2)
    assert pool.scale_ups == 2  # each caller that waits asks for another worker
    pool.release(worker, None)
    assert (await first)[0] is worker and not second.done()
    assert worker.busy == 1 and len(pool._waiters) == 1
    pool.release(worker, None)
    assert (await second)[0] is worker


async def test_a_waiter_that_gave_up_leaves_the_queue_and_takes_no_slot():
    pool = Pool(workers=1, slots=1)
    worker, _ = await pool.acquire()
    gave_up = asyncio.create_task(pool.acquire())
    await waiting(pool, 1)
    gave_up.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gave_up
    assert not pool._waiters
    pool.release(worker, None)
    assert worker.busy == 0


async def test_a_slot_handed_to_a_waiter_that_is_gone_is_given_back():
    pool = Pool(workers=1, slots=1)
    worker, _ = await pool.acquire()
    gone = asyncio.create_task(pool.acquire())
    await waiting(pool, 1)
    pool.release(worker, None)  # the slot is on its way to `gone` (handed on its loop)...
    gone.cancel()               # ...which stops waiting first
    with pytest.raises(asyncio.CancelledError):
        await gone
    await eventually(lambda: worker.busy == 0, "the slot to come back")
    assert (await pool.acquire())[0] is worker


async def test_a_session_keeps_its_worker_and_waits_for_it():
    pool = Pool(workers=2, slots=1)
    chat = session("chat")
    mine, restarted = await pool.acquire(chat)
    assert chat.worker is mine and not restarted and mine.sessions == {"chat": chat}
    pool.release(mine, None)
    other, _ = await pool.acquire()  # someone else takes the session's worker (first of the freest)
    assert other is mine
    again = asyncio.create_task(pool.acquire(chat))
    await waiting(pool, 1)  # its own worker is full: the session waits, though another is free
    anyone, _ = await pool.acquire()  # a caller without a session is not held up behind it
    assert anyone is not mine and not again.done()
    pool.release(mine, None)
    assert (await again)[0] is mine


async def test_a_session_whose_worker_died_moves_on_and_is_told_once():
    pool = Pool(workers=2, slots=1)
    chat = session("chat")
    mine, _ = await pool.acquire(chat)
    pool.release(mine, None)
    mine.state = "dead"
    moved, restarted = await pool.acquire(chat)
    assert moved is not mine and restarted and pool.sessions_moved == 1
    assert chat.worker is moved and "chat" not in mine.sessions
    pool.release(moved, None)
    assert (await pool.acquire(chat)) == (moved, False)  # told once


async def test_an_exclusive_session_owns_an_idle_worker_and_others_keep_off_it():
    pool = Pool(workers=2, slots=4)
    busy, _ = await pool.acquire()
    owner = session("owner", concurrency=-1)
    owned, _ = await pool.acquire(owner)
    assert owned is not busy and owned.exclusive is owner  # the idle one
    for _ in range(3):  # everyone else goes to the shared worker
        assert (await pool.acquire())[0] is busy
    assert (await pool.acquire(owner))[0] is owned  # the owner may run more turns on its own


async def test_exclusive_sessions_never_own_every_instance():
    pool = Pool(workers=2, slots=1, max_instances=2)
    first = session("first", concurrency=-1)
    owned, _ = await pool.acquire(first)
    with pytest.raises(ConcurrencyLimitError, match="at most 1 of the 2 instance"):
        await pool.acquire(session("second", concurrency=-1))
    shared, _ = await pool.acquire()
    assert shared is not owned
    single = Pool(workers=1, slots=1, max_instances=1)
    with pytest.raises(ConcurrencyLimitError, match="one instance"):
        await single.acquire(session("only", concurrency=-1))


async def test_an_ended_or_expired_exclusive_session_frees_its_worker():
    pool = Pool(workers=2, slots=1, max_instances=2)
    owner = session("owner", concurrency=-1, ttl=600)
    owned, _ = await pool.acquire(owner)
    pool.release(owned, None)
    other, _ = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())  # only the owned worker has a free slot
    await waiting(pool, 1)
    owner.end()  # DELETE .../sessions/owner: unpinned, and the waiter gets the worker
    assert (await waiter)[0] is owned and owned.exclusive is None
    pool.release(owned, None)
    pool.release(other, None)
    lapsed = session("lapsed", concurrency=-1, ttl=600)
    owned, _ = await pool.acquire(lapsed)
    pool.release(owned, None)
    lapsed.last_used -= 601  # its TTL ran out: its worker is everyone's again
    assert {(await pool.acquire())[0], (await pool.acquire())[0]} == set(pool.workers)


async def test_a_broken_or_stopping_pool_refuses_and_fails_its_waiters():
    pool = Pool(workers=1, slots=1)
    worker, _ = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await waiting(pool, 1)
    pool.broken = "the handler does not import"
    with pool.lock:
        pool._fail_waiters(WorkerUnavailableError(pool.broken))
    with pytest.raises(WorkerUnavailableError, match="does not import"):
        await waiter
    with pytest.raises(WorkerUnavailableError, match="does not import"):
        await pool.acquire()
    pool.broken, pool.stopping = None, True
    with pytest.raises(WorkerUnavailableError, match="being stopped"):
        await pool.acquire()
    pool.release(worker, None)  # its last slot freed while stopping: the worker stops
    assert worker.stopped


async def test_only_job_says_whether_killing_the_worker_harms_nobody_else():
    from runtime.process.worker_process import PooledCall

    class Inv:
        def __init__(self, inv_id: str) -> None:
            self.id, self.loop = inv_id, asyncio.get_running_loop()

    pool = Pool(workers=1, slots=2)
    worker, _ = await pool.acquire()
    alone = PooledCall(Inv("a"))  # type: ignore[arg-type]
    worker.jobs["a"] = alone
    assert pool.only_job(worker, alone)
    await pool.acquire()
    worker.jobs["b"] = PooledCall(Inv("b"))  # type: ignore[arg-type]
    assert not pool.only_job(worker, alone)
    pool.release(worker, worker.jobs["b"])
    assert pool.only_job(worker, alone) and "b" not in worker.jobs
