"""Finished jobs in memory, bounded in bytes (`jobs.cacheBytes`).

A finished job's input, output items and result are kept in memory only while it is among the
most recently finished (or read) ones whose sizes sum to at most `jobs.cacheBytes`; beyond, the
manager keeps a stub (status, times, error, output count, a small result) and reads the rest back
from the store when a route asks for that job. Without it one token's large jobs held the
node's memory for the whole retention time. Only a store that can read a job back takes part.
"""
from __future__ import annotations

import collections
import json
from typing import Any

from .model import Job

__all__ = ("SMALL_RESULT", "JobCache", "result_size", "stub")

SMALL_RESULT = 4096  # a result up to this many bytes stays on the stub (the job list shows it)


def _size(value: Any) -> int:
    if value is None:
        return 0
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def result_size(job: Job) -> int:
    """The bytes of the job's result (a generator's aggregated result is its items): encoded once a job."""
    return job.output_bytes if job.aggregated else _size(job.result)


def stub(job: Job, result_bytes: int) -> Job:
    """The job without its input and outputs (and without a result over SMALL_RESULT bytes)."""
    small = job.result if not job.aggregated and result_bytes <= SMALL_RESULT else None
    return Job(id=job.id, function=job.function, tenant=job.tenant, event=None, api=job.api, status=job.status,
               created_at=job.created_at, started_at=job.started_at, completed_at=job.completed_at,
               result=small, error=job.error, status_code=job.status_code, webhook=job.webhook,
               execution_timeout=job.execution_timeout, ttl=job.ttl, retried=job.retried, raw=job.raw,
               aggregated=job.aggregated, output_bytes=job.output_bytes, stream_cursor=job.stream_cursor,
               cold_count=len(job.outputs))


class JobCache:
    """Least recently finished (or read) first out, once the sizes pass `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._sizes: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()  # total, result

    def add(self, job_id: str, size: int, result_bytes: int) -> list[tuple[str, int]]:
        """Hold the job (as the most recent); (id, result bytes) of the jobs to make stubs of, oldest
        first (it may be this one)."""
        self.forget(job_id)
        self._sizes[job_id] = (size, result_bytes)
        self.bytes += size
        out: list[tuple[str, int]] = []
        while self.bytes > self.limit and self._sizes:
            victim, (victim_size, victim_result) = self._sizes.popitem(last=False)
            self.bytes -= victim_size
            out.append((victim, victim_result))
        return out

    def forget(self, job_id: str) -> None:
        sizes = self._sizes.pop(job_id, None)
        if sizes is not None:
            self.bytes -= sizes[0]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._sizes
