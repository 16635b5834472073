"""The restart rules (runtime/jobs/recovery.py), without a server or a handler: a stand-in job
manager (runtime/jobs/host.py's JobHost) over a store that hands back the jobs a test gives it.

At start: a finished job past its retention is deleted, a finished one within it is held; a job
that was running and had written output is FAILED (never run twice where a client may have seen
half of it); one that wrote nothing is queued again, under a new invocation id, and stored so; a
queued one is queued; an end the store refused before (the end journal's) is applied instead of
the rules. In cluster mode each job of a dead node is adopted once. Over real restarts (kill -9,
SIGTERM): tests/frontend/jobs/test_jobs_durability.py.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from runtime.config import JobsConfig
from runtime.jobs import recovery
from runtime.jobs.errors import JobStoreError
from runtime.jobs.limits import JobBytes
from runtime.jobs.model import Job
from runtime.jobs.store import JobStore, SharedStore
from runtime.jobs.writes import StoreWrites
from tests.support.waiting import eventually

RETENTION = 3600.0


class Store(JobStore):
    """Loads the jobs given; records what is saved and deleted; refuses saves when told."""

    def __init__(self, jobs: list[Job]) -> None:
        self.stored = jobs
        self.saved: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.refuse = False

    async def load(self) -> list[Job]:
        return self.stored

    def save(self, job: Job, bind: Any = None) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        if self.refuse:
            future.set_exception(JobStoreError("the disk is full"))
        else:
            self.saved.append((job.id, job.status))
            future.set_result(None)
        return future

    def delete(self, job_ids: list[str]) -> asyncio.Future[None]:
        self.deleted += job_ids
        return super().delete(job_ids)


class Writes(StoreWrites):
    """StoreWrites with an end journal the test fills (the SQLite store's is a file)."""

    def __init__(self, store: JobStore, journaled: dict[str, str]) -> None:
        super().__init__(store, delays=())
        self.journaled = dict(journaled)

    async def open_journal(self) -> dict[str, str]:
        return dict(self.journaled)

    async def forget_journaled(self, job_id: str) -> None:
        self.journaled.pop(job_id, None)


class Host:
    """What recovery.py uses of the JobManager (JobHost), recording what it is asked to do."""

    def __init__(self, jobs: list[Job], journaled: dict[str, str] | None = None) -> None:
        self.config = JobsConfig(retentionSeconds=RETENTION)
        self.dispatcher: Any = None
        self.store = Store(jobs)
        self.writes = Writes(self.store, journaled or {})
        self.bytes = JobBytes(self.config)
        self.jobs: dict[str, Job] = {}
        self.stopping = False
        self._running: dict[str, Any] = {}
        self.queued: list[str] = []
        self.kept: list[str] = []
        self.finished: list[tuple[str, str, str]] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        return task

    def _enqueue(self, job: Job, *, counted: bool = False) -> None:
        self.queued.append(job.id)

    def _keep(self, job: Job) -> None:
        self.kept.append(job.id)

    def _notify(self, job: Job) -> None:
        pass

    async def _finish(self, job: Job, status: Any, *, result: Any = None, error: Any = None) -> None:
        await self.writes.save(job.ended(status, result, error), retry=False)
        job.take_end(job.ended(status, result, error))
        self.finished.append((job.id, status, error.message if error is not None else ""))


def job(job_id: str, status: Any, *, outputs: list[Any] | None = None, completed_ago: float | None = None) -> Job:
    now = time.time()
    return Job(id=job_id, function="f", tenant="t", event={"input": job_id}, status=status,
               started_at=None if status == "IN_QUEUE" else now - 10,
               completed_at=None if completed_ago is None else now - completed_ago,
               outputs=outputs or [], invocation_id=f"inv-{job_id}")


async def test_finished_jobs_past_their_retention_are_deleted_and_the_others_held():
    old = job("old", "COMPLETED", completed_ago=RETENTION + 60)
    recent = job("recent", "FAILED", completed_ago=60)
    host = Host([old, recent])
    await recovery.recover(host)
    assert host.store.deleted == ["old"] and "old" not in host.jobs
    assert host.jobs["recent"] is recent and host.kept == ["recent"]
    assert host.queued == [] and host.finished == [] and host.store.saved == []


async def test_a_running_job_that_wrote_output_fails_and_is_never_run_again():
    half = job("half", "IN_PROGRESS", outputs=["a", "b"])
    host = Host([half])
    await recovery.recover(host)
    assert host.queued == []
    [(job_id, status, message)] = host.finished
    assert (job_id, status) == ("half", "FAILED")
    assert "the server restarted while this job was running" in message and "2 output item(s)" in message
    assert host.store.saved == [("half", "FAILED")]


async def test_a_running_job_that_wrote_nothing_is_queued_again_under_a_new_invocation_id():
    fresh = job("fresh", "IN_PROGRESS")
    host = Host([fresh])
    await recovery.recover(host)
    assert host.queued == ["fresh"] and host.finished == []
    assert (fresh.status, fresh.started_at) == ("IN_QUEUE", None)
    assert fresh.invocation_id not in ("", "inv-fresh")  # its first run may have reached a worker
    assert host.store.saved == [("fresh", "IN_QUEUE")]  # stored as queued: the next restart agrees


async def test_a_queued_job_is_queued_as_it_was():
    queued = job("queued", "IN_QUEUE")
    host = Host([queued])
    await recovery.recover(host)
    assert host.queued == ["queued"] and queued.invocation_id == "inv-queued"
    assert host.store.saved == []  # nothing changed: nothing written


async def test_an_end_the_store_refused_before_is_applied_instead_of_the_rules():
    """The journal says the job ended (FAILED: its end could not be stored); its clients were
    told so: it is not run again, and once stored its journal entry goes."""
    told = job("told", "IN_PROGRESS")
    host = Host([told], journaled={"told": "the job ended COMPLETED but its end could not be stored",
                                   "gone": "an end whose job expired meanwhile"})
    await recovery.recover(host)
    assert host.queued == []
    assert host.finished == [("told", "FAILED", "the job ended COMPLETED but its end could not be stored")]
    assert host.writes.journaled == {}  # both settled: stored now, or nothing left to apply


async def test_a_requeue_the_store_refuses_is_logged_and_the_job_still_queued(caplog):
    fresh = job("fresh", "IN_PROGRESS")
    host = Host([fresh])
    host.store.refuse = True
    with caplog.at_level(logging.WARNING, logger="fnstream.jobs"):
        await recovery.recover(host)
    assert host.queued == ["fresh"] and fresh.status == "IN_QUEUE"  # it is marked running before it starts
    assert "job fresh is queued again, but the store refused to record it" in caplog.text


class Shared(SharedStore):
    """A shared store whose dead nodes leave the jobs a test gives it, claimed once each."""

    lease = 0.03

    def __init__(self) -> None:
        self.orphans: list[Job] = []
        self.rounds = 0
        self.fail_next = False

    async def claim_orphans(self, adopt: Any) -> int:
        self.rounds += 1
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("Redis is away")
        taken, self.orphans = self.orphans, []
        for orphan in taken:
            adopt(orphan)
        return len(taken)


async def test_a_dead_nodes_jobs_are_adopted_once_each_and_made_this_nodes(caplog):
    host = Host([])
    shared = Shared()
    running, queued = job("running", "IN_PROGRESS"), job("queued", "IN_QUEUE")
    shared.fail_next = True  # the first look fails: logged, and the next round looks again
    shared.orphans = [running, queued, job("running", "IN_PROGRESS")]  # offered twice: adopted once
    with caplog.at_level(logging.WARNING, logger="fnstream.jobs"):
        task = asyncio.create_task(recovery.take_over(host, shared))
        await eventually(lambda: sorted(host.queued) == ["queued", "running"], "the orphans to be queued here")
        await asyncio.gather(*host.tasks)
        host.stopping = True
        await asyncio.wait_for(task, 5)  # returns once the manager stops
    assert "could not look for a dead node's jobs: Redis is away" in caplog.text
    assert host.jobs == {"running": running, "queued": queued}
    assert sorted(host.store.saved) == [("queued", "IN_QUEUE"), ("running", "IN_QUEUE")]  # both owned here now
    assert running.invocation_id != "inv-running"


@pytest.mark.parametrize("status", ["COMPLETED", "CANCELLED"])
async def test_a_final_job_adopted_is_held_not_run(status):
    host = Host([])
    done = job("done", status, completed_ago=1)
    await recovery.adopt(host, done, "the node running it stopped", take_ownership=True)
    assert host.jobs["done"] is done and host.kept == ["done"]
    assert host.queued == [] and host.store.saved == []
