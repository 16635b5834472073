"""The job: one invocation of a function run in the background, with every output item kept.

One model, three views: RunPod's (`/v2/...`), openYuanrong's async results, and fnstream's own
(`/serverless/v1/jobs/{id}`). Times are epoch seconds inside; the views give milliseconds.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ..deployment import function_key

if TYPE_CHECKING:
    from ..errors import FunctionServiceError
    from .key_store import KeyBind

__all__ = ("FINAL", "YUANRONG_STATUS", "Api", "Job", "JobRequest", "Status", "new_job_id")

Api = Literal["runpod", "yuanrong", "fnstream"]  # which API submitted it (and whose views it follows)
Status = Literal["IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"]
FINAL: frozenset[str] = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})
YUANRONG_STATUS: dict[str, str] = {"IN_QUEUE": "pending", "IN_PROGRESS": "running", "COMPLETED": "completed",
                                   "FAILED": "failed", "TIMED_OUT": "failed", "CANCELLED": "cancelled"}


def new_job_id() -> str:
    return str(uuid.uuid4())


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _rfc3339(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class JobRequest:
    """How a job was asked for (Dispatcher.submit_job): the API, a webhook, the policy's limits."""

    api: Api = "fnstream"
    webhook: str | None = None                # already checked against jobs.webhook.allowedHosts
    execution_timeout: float | None = None    # seconds; capped at the function's timeout
    ttl: float | None = None                  # seconds from creation until it must have started
    sync: bool = False                        # RunPod's /runsync: jobs.maxInputBytesSync applies
    key: KeyBind | None = None                # its Idempotency-Key, bound by the job's first save


@dataclass
class Job:
    """A job's state. `outputs` are the JSON-able items in order (item n has event id n)."""

    id: str
    function: str
    tenant: str
    event: Any
    api: Api = "fnstream"
    status: Status = "IN_QUEUE"
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    completed_at: float | None = None
    result: Any = None                   # the answer a sync JSON call would have given
    error: dict[str, Any] | None = None  # {"code", "message"} (fnstream's error shape)
    status_code: int | None = None       # the HTTP status the sync call would have answered
    webhook: str | None = None
    execution_timeout: float | None = None  # seconds, already capped at the function's timeout
    ttl: float | None = None                # seconds from creation
    retried: int = 0
    raw: bool = False                       # the function frames its own SSE (rawStream)
    aggregated: bool = False                # `result` is the list of a generator's items
    outputs: list[Any] = field(default_factory=list)
    output_bytes: int = 0
    stream_cursor: int = 0                  # items already returned by RunPod's /stream
    # The id of its (next) run's invocation, answered as X-Invocation-Id from the submit on, so the
    # answer, the run's log lines and its metrics name one id. A re-run (retry, restart) gets a new
    # one: a cluster worker runs an id once. "" in rows stored before it existed (made at start).
    invocation_id: str = ""
    # Not persisted: set by the runner while the job runs.
    cancel_requested: bool = field(default=False, compare=False)
    remote: bool = field(default=False, compare=False)  # read from a shared store: another node runs it
    changing: bool = field(default=False, compare=False)  # a new state is being stored (runtime/jobs/writes.py)
    cold_count: int | None = field(default=None, compare=False)  # a stub (runtime/jobs/cache.py): its outputs' count
    stored_input: int = field(default=0, compare=False)  # a stub's input bytes in the store (jobs.tenantQuotaBytes)
    progress: Any = field(default=None, compare=False)  # runpod.serverless.progress_update(job, data)

    @property
    def key(self) -> str:
        """Its function's `function_key` (names are per tenant): what queues and lookups go by."""
        return function_key(self.tenant, self.function)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def delay_ms(self) -> int:
        start = self.started_at if self.started_at is not None else (self.completed_at or time.time())
        return int((start - self.created_at) * 1000)

    def execution_ms(self) -> int:
        if self.started_at is None:
            return 0
        end = self.completed_at if self.completed_at is not None else time.time()
        return int((end - self.started_at) * 1000)

    # -- views -------------------------------------------------------------------------------
    def runpod(self) -> dict[str, Any]:
        """RunPod's status object: `output` once completed, `error` once failed."""
        data: dict[str, Any] = {"id": self.id, "status": self.status, "delayTime": self.delay_ms(),
                                "executionTime": self.execution_ms()}
        if self.status == "COMPLETED":
            data["output"] = self.result
        elif self.status == "IN_PROGRESS" and self.progress is not None:
            data["output"] = self.progress  # RunPod shows the last progress update as the output
        elif self.error is not None:
            data["error"] = self.error["message"]
        if self.retried:
            data["retries"] = self.retried
        return data

    def yuanrong(self) -> dict[str, Any]:
        """openYuanrong's async result: `statusCode` and `respBody` once finished."""
        data: dict[str, Any] = {"requestId": self.id, "status": YUANRONG_STATUS[self.status]}
        if self.final:
            data["statusCode"] = self.status_code
            data["respBody"] = self.result if self.error is None else self.error
        return data

    def public(self) -> dict[str, Any]:
        """fnstream's own view: everything but the output items (those are on /events)."""
        return {"id": self.id, "function": self.function, "tenant": self.tenant, "status": self.status,
                "api": self.api, "createdAt": _rfc3339(self.created_at), "startedAt": _rfc3339(self.started_at),
                "completedAt": _rfc3339(self.completed_at), "delayTime": self.delay_ms(),
                "executionTime": self.execution_ms(), "outputCount": self.output_count(),
                "outputBytes": self.output_bytes, "result": self.result, "error": self.error,
                "statusCode": self.status_code, "retries": self.retried, "invocationId": self.invocation_id}

    def output_count(self) -> int:
        return len(self.outputs) if self.cold_count is None else self.cold_count

    @property
    def cold(self) -> bool:
        """A stub of a finished job whose input and outputs are in the store only (runtime/jobs/cache.py)."""
        return self.cold_count is not None

    def completed_at_rfc3339(self) -> str | None:
        return _rfc3339(self.completed_at)

    # -- persistence -------------------------------------------------------------------------
    def row(self) -> dict[str, Any]:
        """The persisted fields (outputs are stored apart, one row each)."""
        return {"id": self.id, "function": self.function, "tenant": self.tenant, "event": self.event,
                "api": self.api, "status": self.status, "created_at": self.created_at,
                "started_at": self.started_at, "completed_at": self.completed_at, "result": self.result,
                "error": self.error, "status_code": self.status_code, "webhook": self.webhook,
                "execution_timeout": self.execution_timeout, "ttl": self.ttl, "retried": self.retried,
                "raw": self.raw, "aggregated": self.aggregated, "output_bytes": self.output_bytes,
                "stream_cursor": self.stream_cursor, "invocation_id": self.invocation_id}

    @classmethod
    def from_row(cls, row: dict[str, Any], outputs: list[Any]) -> Job:
        return cls(**row, outputs=outputs)

    def refresh(self, newer: Job, new_outputs: list[Any]) -> None:
        """Take the stored state of a job another node runs; `new_outputs` follow the ones held."""
        for key, value in newer.row().items():
            setattr(self, key, value)
        self.outputs.extend(new_outputs)

    def ended(self, status: Status, result: Any, error: FunctionServiceError | None) -> Job:
        """A copy of the job as it ends (stored first; its end fields become the job's once stored)."""
        return replace(self, status=status, completed_at=time.time(), result=result,
                       error=error.to_dict() if error is not None else None,
                       status_code=error.status if error is not None else 200)

    def take_end(self, ended: Job) -> None:
        """The end fields of `ended` (this job's `ended()` copy, once stored)."""
        for name in _END_FIELDS:
            setattr(self, name, getattr(ended, name))


_END_FIELDS = ("status", "completed_at", "result", "error", "status_code")
