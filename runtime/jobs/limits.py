"""Size limits of jobs, answered at submit: input bytes per job (RunPod's 10 MB for `/run`, 20 MB
for `/runsync`) and the bytes a tenant's jobs hold in the store (inputs and outputs of the jobs
kept until they expire). Beyond either the submit is refused (413, 507): never a failed write later.
"""
from __future__ import annotations

import collections
import json
from typing import Any

from ..config import JobsConfig
from .errors import JobInputTooLargeError, JobQuotaError
from .model import Job

__all__ = ("JobBytes", "input_size")


def input_size(event: Any) -> int:
    """The bytes the job's input takes in the store (its JSON)."""
    return len(json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode())


class JobBytes:
    """Each tenant's stored bytes (inputs, outputs and results of the jobs held), and the checks at submit."""

    def __init__(self, config: JobsConfig) -> None:
        self.config = config
        self._inputs: dict[str, tuple[str, int]] = {}  # job id -> (tenant, input bytes)
        self._outputs: dict[str, tuple[str, int]] = {}  # job id -> (tenant, output bytes counted)
        self._results: dict[str, tuple[str, int]] = {}  # job id -> (tenant, result bytes: an echo's is its input)
        self.by_tenant: collections.Counter[str] = collections.Counter()

    def check(self, tenant: str, size: int, *, sync: bool) -> None:
        limit = self.config.maxInputBytesSync if sync else self.config.maxInputBytes
        key = "jobs.maxInputBytesSync" if sync else "jobs.maxInputBytes"
        if size > limit:
            raise JobInputTooLargeError(f"the job's input is {size} bytes; at most {limit} ({key})")
        quota = self.config.tenantQuotaBytes
        if self.by_tenant[tenant] + size > quota:
            raise JobQuotaError(f"tenant {tenant!r} holds {self.by_tenant[tenant]} bytes of jobs; this job's "
                                f"{size} would pass jobs.tenantQuotaBytes ({quota}); retry once older jobs expire")

    def add_input(self, job: Job, size: int) -> None:
        self._inputs[job.id] = (job.tenant, size)
        self.by_tenant[job.tenant] += size

    def outputs(self, job: Job) -> None:
        """Count the job's output bytes as they are now (after new items, or a retry's reset)."""
        _, before = self._outputs.get(job.id, (job.tenant, 0))
        self._outputs[job.id] = (job.tenant, job.output_bytes)
        self.by_tenant[job.tenant] += job.output_bytes - before

    def result(self, job: Job, size: int) -> None:
        """Count the finished job's result (`size` bytes; a generator's aggregated one is its outputs)."""
        if job.aggregated or job.id in self._results:
            return
        self._results[job.id] = (job.tenant, size)
        self.by_tenant[job.tenant] += size

    def input_of(self, job_id: str) -> int:
        return self._inputs.get(job_id, ("", 0))[1]

    def forget(self, job_id: str) -> None:
        for table in (self._inputs, self._outputs, self._results):
            tenant, size = table.pop(job_id, ("", 0))
            if size:
                self.by_tenant[tenant] -= size
