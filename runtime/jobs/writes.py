"""The runner's writes to the job store: every one awaited, retried, and a failure acted on.

A store write that is not awaited loses its error: a submit answered before it was stored, a
job reported COMPLETED that a restart finds half-written. So the runner awaits each write here;
writes of one job run one at a time (the row is taken when its turn comes, so a later change is
never overwritten by an earlier one); a refused output or final write is retried a few times
with short backoff, then the job fails loudly: `failures` counts it (the metrics scrape reads
it), one log line names the job and the error. A final state that could not be stored either is
kept in `unsaved` and written again on each `flush` (the sweeper's, and at stop), and recorded in
the end journal (end_journal.py: space allocated at start), so a restart before a flush took still
finds the job over, as its clients were told, and never runs it again.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from .end_journal import EndJournal
from .errors import JobStoreError
from .key_store import KeyBind
from .model import Job
from .store import JobStore, SqliteJobStore

__all__ = ("RETRY_DELAYS", "StoreWrites")

log = logging.getLogger("fnstream.jobs")

RETRY_DELAYS = (0.05, 0.2, 0.5)  # seconds before the 2nd, 3rd and 4th attempt of a refused write


class _Turn:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class StoreWrites:
    """The job store as the runner writes it (see the module docstring)."""

    def __init__(self, store: JobStore, delays: tuple[float, ...] = RETRY_DELAYS) -> None:
        self.store = store
        self.delays = delays
        self.failures = 0                 # jobs failed by a refused write (fnstream_job_store_failures_total)
        self.refused = 0                  # writes refused, retries included (fnstream_job_store_refused_writes_total)
        self.unsaved: dict[str, Job] = {}  # final states not stored yet, by job id
        self._turns: dict[str, _Turn] = {}
        self._failed: set[str] = set()     # jobs already counted and logged
        self.journal = EndJournal(store.path.with_name(store.path.name + ".ends")) \
            if isinstance(store, SqliteJobStore) else None

    @contextlib.asynccontextmanager
    async def _turn(self, job_id: str) -> AsyncIterator[None]:
        turn = self._turns.get(job_id)
        if turn is None:
            turn = self._turns[job_id] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[job_id]

    async def _attempt(self, job_id: str, write: Callable[[], asyncio.Future[None]], retry: bool) -> None:
        delays = self.delays if retry else ()
        for attempt in range(len(delays) + 1):
            try:
                async with self._turn(job_id):
                    await write()
                return
            except JobStoreError:
                self.refused += 1
                if attempt == len(delays):
                    raise
            await asyncio.sleep(delays[attempt])

    async def save(self, job: Job, *, retry: bool = True, bind: KeyBind | None = None) -> None:
        """Store the job's row (as it is when its turn comes); JobStoreError once retries are spent.
        `bind`: a new job's Idempotency-Key, bound in the same transaction (JobStore.save)."""
        await self._attempt(job.id, lambda: self.store.save(job, bind), retry)
        self.unsaved.pop(job.id, None)
        if job.final and self.journal is not None and job.id in self.journal:
            await self.journal.clear(job.id)

    async def open_journal(self) -> dict[str, str]:
        """At start: the ends the store refused before (job id -> error), to apply before the restart rules."""
        return await self.journal.open() if self.journal is not None else {}

    async def forget_journaled(self, job_id: str) -> None:
        if self.journal is not None:
            await self.journal.clear(job_id)

    async def keep_unsaved(self, job: Job, error: str) -> None:
        """The store refused `job`'s end (FAILED with `error`): written again on each flush, and kept
        in the journal meanwhile."""
        self.unsaved[job.id] = job
        if self.journal is not None and not await self.journal.record(job.id, error):
            log.error("jobs: the end of job %s is kept in memory only: a restart before the store takes it "
                      "will apply the restart rules", job.id)

    async def add_outputs(self, job: Job, first: int, items: list[Any]) -> None:
        output_bytes = job.output_bytes
        await self._attempt(job.id, lambda: self.store.add_outputs(job.id, first, items, output_bytes), True)

    async def clear_outputs(self, job: Job) -> None:
        await self._attempt(job.id, lambda: self.store.clear_outputs(job.id), False)

    async def delete(self, job_ids: list[str]) -> None:
        """Forget expired jobs; a refusal is logged (they stay stored, and expire at the next start)."""
        try:
            await self.store.delete(job_ids)
        except JobStoreError as exc:
            self.refused += 1
            log.warning("jobs: %d expired job(s) could not be deleted from the store: %s", len(job_ids), exc.message)

    def failed(self, job: Job, error: JobStoreError) -> None:
        """Count and log, once per job, that a refused write failed it."""
        if job.id in self._failed:
            return
        self._failed.add(job.id)
        self.failures += 1
        log.error("jobs: job %s (function %s) failed: the job store refused its write: %s",
                  job.id, job.function, error.message)

    def forget(self, job_id: str) -> None:
        self._failed.discard(job_id)
        self.unsaved.pop(job_id, None)

    async def flush(self) -> int:
        """Write the final states not stored yet once more (no retries); how many are still not stored."""
        for job in list(self.unsaved.values()):
            try:
                await self.save(job, retry=False)
            except JobStoreError:
                pass
            else:
                log.info("jobs: the final state of job %s is stored now", job.id)
        return len(self.unsaved)
