"""What the job manager answers about its jobs: look-ups, listings, waiting for and following a
job's output (on this node, or read again from a shared store when another node runs it), and
which finished jobs it holds in full (runtime/jobs/cache.py): a stub's job is read back here."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from ..principal import Principal
from .cache import JobCache, result_size, stub
from .errors import JobNotFoundError
from .limits import JobBytes
from .model import Job
from .store import JobStore, SharedStore

__all__ = ("REMOTE_POLL", "JobReads")

REMOTE_POLL = 0.05    # seconds between reads of a job another node runs (shared store)


class JobReads:
    """The read side of JobManager (its base): nothing here changes a job."""

    jobs: dict[str, Job]
    store: JobStore
    shared: SharedStore | None
    cache: JobCache | None  # None: every job is held in full (a store that cannot read one back)
    bytes: JobBytes
    _changed: dict[str, asyncio.Event]
    released = False  # shutdown: waiters and followers return with the job as it is (release_readers)

    def _keep(self, job: Job) -> None:
        """A job just finished (and stored), or read back: hold it in full while the cache has room."""
        if not job.final or job.remote or job.cold:
            return
        result_bytes = result_size(job)
        self.bytes.result(job, result_bytes)  # the tenant's quota counts what the store holds
        if self.cache is None:
            return
        size = self.bytes.input_of(job.id) + job.output_bytes + result_bytes
        for victim_id, victim_result in self.cache.add(job.id, size, result_bytes):
            victim = self.jobs.get(victim_id)
            if victim is not None and victim.final and not victim.changing and not victim.cold:
                self.jobs[victim_id] = stub(victim, victim_result)  # readers of the full job keep it till they end

    async def _warm(self, cold: Job) -> Job:
        """The stub's job in full, read back from the store (and held again, as the most recent)."""
        job = await self.store.read_job(cold.id)
        if job is None:
            raise JobNotFoundError(f"job {cold.id!r} not found (it expired)")
        held = self.jobs.get(cold.id)
        if held is cold:
            self.jobs[job.id] = job
            self._keep(job)
        elif held is not None and not held.cold:
            return held  # read back by another call meanwhile, or retried
        return job

    def get(self, job_id: str, principal: Principal | None = None, function: str | None = None) -> Job:
        """A job of this node; 404 when unknown, of another tenant than the principal's, or of
        another function (as for an unknown id: a job's existence is not another tenant's business)."""
        return _visible(self.jobs.get(job_id), job_id, principal, function)

    async def by_invocation(self, inv_id: str, principal: Principal | None = None) -> Job | None:
        """This node's job whose run has the invocation id `inv_id` (its answers' X-Invocation-Id),
        if `principal` may see it; else None. A scan of the jobs held: only asked for an id that
        is no kept invocation's (frontend/routes/invocations.py)."""
        for job in self.jobs.values():
            if job.invocation_id == inv_id:
                if principal is not None and job.tenant != principal.tenant:
                    return None
                return await self._warm(job) if job.cold else job
        return None

    async def lookup(self, job_id: str, principal: Principal | None = None, function: str | None = None) -> Job:
        """`get`, or in cluster mode a job another node runs, read from the shared store."""
        job = self.jobs.get(job_id)
        if job is None and self.shared is not None:
            job = await self.shared.fetch(job_id)
            if job is not None:
                job.remote = True
        job = _visible(job, job_id, principal, function)
        return await self._warm(job) if job.cold else job

    async def _refresh(self, job: Job) -> None:
        """Re-read a remote job (its new output items appended)."""
        assert self.shared is not None
        newer = await self.shared.fetch(job.id, len(job.outputs))
        if newer is None:
            raise JobNotFoundError(f"job {job.id!r} not found (it expired)")
        job.refresh(newer, newer.outputs)

    def list_jobs(self, principal: Principal | None = None, function: str | None = None,
                  limit: int = 100) -> list[Job]:
        """This node's jobs the principal may see (all when auth is off), newest first."""
        jobs = [j for j in self.jobs.values() if (principal is None or j.tenant == principal.tenant)
                and (function is None or j.function == function)]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)[:limit]

    async def list_all(self, principal: Principal | None = None, function: str | None = None,
                       limit: int = 100) -> list[Job]:
        """`list_jobs`, in cluster mode of every node (this node's own as held here: the freshest)."""
        mine = self.list_jobs(principal, function, limit)
        if self.shared is None:
            return mine
        tenant = None if principal is None else principal.tenant
        found = {j.id: j for j in await self.shared.recent(function=function, tenant=tenant, limit=limit)
                 if (tenant is None or j.tenant == tenant) and (function is None or j.function == function)}
        found.update((j.id, j) for j in mine)
        return sorted(found.values(), key=lambda j: j.created_at, reverse=True)[:limit]

    async def counts_all(self, function: str, tenant: str) -> dict[str, int]:
        """`counts`, in cluster mode of every node's jobs of the tenant's `function` (this node's as held here)."""
        if self.shared is None:
            return self.counts(function, tenant)
        jobs = {j.id: j for j in await self.shared.recent(function=function)
                if j.function == function and j.tenant == tenant}  # names are per tenant
        jobs.update((j.id, j) for j in self.jobs.values() if j.function == function and j.tenant == tenant)
        return _count(jobs.values())

    def changed(self, job: Job) -> asyncio.Event:
        """An event set at the job's next change (a new output item or a new status)."""
        event = self._changed.get(job.id)
        if event is None:
            event = self._changed[job.id] = asyncio.Event()
        return event

    def _notify(self, job: Job) -> None:
        event = self._changed.pop(job.id, None)
        if event is not None:
            event.set()

    async def release_readers(self) -> None:
        """Shutdown (Lifecycle.end_streams): every `wait` and `follow` returns now, and later ones at
        once, with the job as it is: a job the drain aborted stays IN_PROGRESS (the restart rules
        apply), and no request may wait for an end that comes only after a restart."""
        self.released = True
        for event in self._changed.values():
            event.set()
        self._changed.clear()

    async def wait(self, job: Job, timeout: float) -> None:
        """Until the job is final, `timeout` seconds passed, or the readers are released (shutdown)."""
        deadline = time.monotonic() + timeout
        while not job.final and not self.released:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if job.remote:
                await asyncio.sleep(min(left, REMOTE_POLL))
                await self._refresh(job)
                continue
            try:
                await asyncio.wait_for(self.changed(job).wait(), left)
            except TimeoutError:
                return

    async def follow(self, job: Job, after: int = 0, heartbeat: float | None = None) -> AsyncIterator[list[Any]]:
        """Batches of output items after item `after`, live, until the job is final and all are out.

        Yields [] after `heartbeat` seconds without a new item (so the caller can ping). Returns early,
        the job not final, once the readers are released (shutdown)."""
        sent = after
        quiet_since = time.monotonic()
        while True:
            event = self.changed(job)
            if len(job.outputs) > sent:
                batch = job.outputs[sent:]
                sent += len(batch)
                quiet_since = time.monotonic()
                yield batch
                continue
            if job.final or self.released:
                return
            if job.remote:  # another node runs it: read the shared store again shortly
                if heartbeat is not None and time.monotonic() - quiet_since >= heartbeat:
                    quiet_since = time.monotonic()
                    yield []
                await asyncio.sleep(REMOTE_POLL)
                await self._refresh(job)
                continue
            try:
                await asyncio.wait_for(event.wait(), heartbeat)
            except TimeoutError:
                yield []

    def counts(self, function: str, tenant: str) -> dict[str, int]:
        return _count(j for j in self.jobs.values() if j.function == function and j.tenant == tenant)


def _count(jobs: Iterable[Job]) -> dict[str, int]:
    """RunPod's /health job counts."""
    counts = {"completed": 0, "failed": 0, "inProgress": 0, "inQueue": 0, "retried": 0, "cancelled": 0}
    key = {"COMPLETED": "completed", "FAILED": "failed", "TIMED_OUT": "failed", "IN_PROGRESS": "inProgress",
           "IN_QUEUE": "inQueue", "CANCELLED": "cancelled"}
    for job in jobs:
        counts[key[job.status]] += 1
        counts["retried"] += 1 if job.retried else 0
    return counts


def _visible(job: Job | None, job_id: str, principal: Principal | None, function: str | None) -> Job:
    if job is None or (principal is not None and job.tenant != principal.tenant) or (
            function is not None and job.key != function):  # `function`: a `function_key`
        raise JobNotFoundError(f"job {job_id!r} not found")
    return job
