"""The restart rules: jobs whose runner is gone (this server before a restart, or a dead cluster
node) are taken back by the job manager.

A job that had written output is FAILED — never run twice where a client may have seen half of
it — and any other unfinished job is queued to run (again) here. A job is stored as running
before its handler starts (runner.py), and its end is stored before it is shown, so a job that
finished is never run again; the one exception is an end the store refused and that could not
be stored later either (logged at stop, naming the job).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..errors import ServiceUnavailableError
from ..invocation_ids import new_invocation_id
from .errors import JobStoreError
from .limits import input_size
from .model import Job
from .store import SharedStore

if TYPE_CHECKING:
    from .host import JobHost

__all__ = ("adopt", "recover", "take_over")

log = logging.getLogger("fnstream.jobs")


async def recover(manager: JobHost) -> None:
    """Load the stored jobs (at start) and apply the restart rules; expired finished jobs are deleted."""
    recovered = requeued = 0
    now = time.time()
    expired: list[str] = []
    ended = await manager.writes.open_journal()  # ends the store refused before: over, as clients were told
    for job in await manager.store.load():
        if job.final and job.completed_at is not None and job.completed_at + manager.config.retentionSeconds < now:
            expired.append(job.id)  # expired while the server was down
            continue
        recovered += job.status == "IN_PROGRESS" and job.id not in ended
        await adopt(manager, job, "the server restarted", ended=ended.get(job.id))
        requeued += job.status == "IN_QUEUE"
    for job_id in ended:  # stored after all (a flush took, or just now), or expired: nothing left to apply
        held = manager.jobs.get(job_id)
        if held is None or (held.final and job_id not in manager.writes.unsaved):
            await manager.writes.forget_journaled(job_id)
    if expired:
        await manager.writes.delete(expired)
    if recovered or requeued:
        log.info("jobs: %d queued job(s) after restart (%d were running)", requeued, recovered)


async def adopt(manager: JobHost, job: Job, what: str, *, take_ownership: bool = False,
                ended: str | None = None) -> None:
    """Hold `job` and apply the restart rules to it (`what` says why its runner is gone); `ended`: the
    error of an end the store refused before (the journal's), applied instead of the rules."""
    manager.jobs[job.id] = job
    manager.bytes.add_input(job, job.stored_input if job.cold else input_size(job.event))
    manager.bytes.outputs(job)
    if job.final and not job.cold:
        manager._keep(job)  # (the SQLite store loads finished jobs as stubs: read back when asked for)
    if ended is not None and not job.final:  # over, as its clients were told: never run again
        await manager._finish(job, "FAILED", error=JobStoreError(ended or "its end was not stored"))
        return
    if job.status == "IN_PROGRESS":
        if job.outputs:
            await manager._finish(job, "FAILED", error=ServiceUnavailableError(
                f"{what} while this job was running; it had written {len(job.outputs)} "
                "output item(s), so it was not run again"))
            return
        job.status, job.started_at = "IN_QUEUE", None
        job.invocation_id = new_invocation_id()  # its first run may have reached a cluster worker
        take_ownership = True
    if job.status == "IN_QUEUE":
        manager._enqueue(job)
        if take_ownership:  # the store says it is queued (and, shared, this node's); it is marked
            try:           # running again before it starts, so a refusal here loses nothing
                await manager.writes.save(job, retry=False)
            except JobStoreError as exc:
                log.warning("jobs: job %s is queued again, but the store refused to record it: %s",
                            job.id, exc.message)


async def take_over(manager: JobHost, shared: SharedStore) -> None:
    """Cluster mode: adopt the unfinished jobs of nodes that stopped renewing their lease."""
    def take(job: Job) -> None:
        if job.id not in manager.jobs:
            manager.jobs[job.id] = job  # held now: a second claim of it is refused at once
            manager.spawn(adopt(manager, job, "the node running it stopped", take_ownership=True),
                          f"jobs-adopt-{job.id}")

    while True:
        await asyncio.sleep(shared.lease / 3)
        if manager.stopping:
            return
        try:
            await shared.claim_orphans(take)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis away: the next round tries again (what was not taken stays)
            log.warning("jobs: could not look for a dead node's jobs: %s", exc)
