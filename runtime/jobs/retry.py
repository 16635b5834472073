"""Retry: a FAILED or TIMED_OUT job runs again, its output afresh, as a new invocation.

Without a shared store the job is this node's: its output is cleared and its new state stored.
In cluster mode (Redis) a retry works through any node: one script checks that the stored job is
still as it was read (FAILED or TIMED_OUT, the same `retried` count), makes it this node's,
clears its output and tells the node that held it, which forgets its copy (runner.py's
`_taken_from_us`). Of two retries at once, through one node or two, one runs the job and the
other is 409, as a retry of a queued job; the node that ran it before never deletes it on expiry.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Protocol

from ..invocation_ids import new_invocation_id
from .errors import JobStateError
from .host import JobHost
from .limits import input_size
from .model import Job

if TYPE_CHECKING:
    from .cache import JobCache
    from .store import SharedStore

__all__ = ("retry",)

_RESET = ("status", "started_at", "completed_at", "result", "error", "status_code", "aggregated", "outputs",
          "output_bytes", "stream_cursor", "retried", "created_at", "invocation_id")


class RetryHost(JobHost, Protocol):
    cache: JobCache | None
    shared: SharedStore | None

    def _check_queue_room(self, tenant: str) -> None: ...


def _not_retriable(job: Job, status: str) -> JobStateError:
    return JobStateError(f"job {job.id!r} is {status}; only a FAILED or TIMED_OUT job can be retried")


async def retry(manager: RetryHost, job: Job) -> Job:
    """Queue `job` (held here, or in cluster mode read from the store) to run again; 409 when it is
    not FAILED or TIMED_OUT (or was retried meanwhile), 507 when the store refuses the new state
    (the job stays as it was)."""
    if job.status not in ("FAILED", "TIMED_OUT") or job.changing:
        raise _not_retriable(job, job.status)
    manager._check_queue_room(job.tenant)
    again = dataclasses.replace(job, status="IN_QUEUE", started_at=None, completed_at=None, result=None,
                                error=None, status_code=None, aggregated=False, outputs=[], output_bytes=0,
                                stream_cursor=0, retried=job.retried + 1, created_at=time.time(),
                                invocation_id=new_invocation_id())
    job.changing = True
    try:
        if manager.shared is not None:
            if not await manager.shared.retake(job, again):  # (taken by another node's retry: forgotten here)
                raise _not_retriable(job, "no longer FAILED or TIMED_OUT (it was retried meanwhile)")
        else:
            await manager.writes.clear_outputs(job)
            await manager.writes.save(again, retry=False)
    finally:
        job.changing = False
    manager.writes.forget(job.id)
    if manager.cache is not None:
        manager.cache.forget(job.id)
    if job.remote:  # taken from another node: this one runs it now, and counts its input
        job.remote = False
        manager.bytes.add_input(job, input_size(job.event))
    manager.jobs[job.id] = job  # `job` was read back from the store if only a stub was held
    for name in _RESET:
        setattr(job, name, getattr(again, name))
    manager.bytes.outputs(job)
    manager._notify(job)
    manager._enqueue(job)
    return job
