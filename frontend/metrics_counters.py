"""Invocation and job counters: what the invoke routes add to on the hot path.

Cheap: the invoke (frontend/routes/invoke.py `Invoker.serve`, behind both doors) and the OpenAI
routes (`@invocation_route`, frontend/respond.py) only add to plain ints and histogram buckets in
`InvocationStats` (everything runs on the event loop thread, so no locks); finished jobs are
counted by the job manager's `on_final` hook. Apart from the scrape (metrics_collector.py): this
is what runs per request.
"""
from __future__ import annotations

import bisect
from time import monotonic
from typing import Any

from aiohttp import web
from prometheus_client.samples import Exemplar

from runtime.errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError
from runtime.jobs.model import Job
from runtime.manifest import FunctionSpec

from .sse import CURRENT_STREAM

__all__ = ("CLIENT_GONE", "DISCONNECTED", "FUNCTION", "FUNCTION_LABELS", "INVOCATION", "JOB_METRICS", "JOB_STATUS",
           "METRICS", "InvocationStats", "JobStats", "TenantFunction", "count_answered", "count_refused",
           "outcome_of")

# The invocation a request started (set by the invoke routes' start_invocation).
INVOCATION = web.RequestKey("invocation", object)
# The function an invoke route is about to run: a call refused before it started (429) has no invocation.
FUNCTION = web.RequestKey("function", FunctionSpec)

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
FIRST_EVENT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
JOB_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)
DISCONNECTED = "disconnected"
CLIENT_GONE = "client disconnected"  # the cancel reason of an invocation whose client left (frontend/respond.py)
# A job's status (runtime/jobs/model.py) as the `status` label.
JOB_STATUS = {"IN_QUEUE": "queued", "IN_PROGRESS": "running", "COMPLETED": "completed", "FAILED": "failed",
              "CANCELLED": "cancelled", "TIMED_OUT": "timed_out"}

TenantFunction = tuple[str, str]  # (tenant, function): the key of every per-function series
FUNCTION_LABELS = ["tenant", "function"]


class _Histogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class _ExemplarHistogram(_Histogram):
    """A histogram whose buckets remember their latest observation's invocation id: OpenMetrics
    exemplars (`# {invocation_id="..."} 0.012`), from a latency bucket to the invocation itself.
    Two list stores per observation (the id string and the float exist already): no allocation."""

    __slots__ = ("ids", "values")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__(bounds)
        self.ids: list[str | None] = [None] * len(self.counts)
        self.values = [0.0] * len(self.counts)

    def observe_of(self, value: float, invocation_id: str | None) -> None:
        i = bisect.bisect_left(self.bounds, value)
        self.counts[i] += 1
        self.total += value
        if invocation_id is not None:
            self.ids[i] = invocation_id
            self.values[i] = value

    def buckets_with_exemplars(self) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
        out: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        for (bound, running), inv_id, value in zip(self.buckets(), self.ids, self.values, strict=True):
            out.append((bound, running) if inv_id is None
                       else (bound, running, Exemplar({"invocation_id": inv_id}, value)))
        return out


class _PerFunction:
    __slots__ = ("bytes", "codes", "duration", "events", "first_event", "heartbeats")

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}  # how its invocations ended: error code (or 'disconnected') -> count
        self.duration = _ExemplarHistogram(DURATION_BUCKETS)
        self.first_event = _Histogram(FIRST_EVENT_BUCKETS)
        self.events = 0
        self.bytes = 0
        self.heartbeats = 0


def outcome_of(code: int | str) -> str:
    if code == 0:
        return "ok"
    if code == DISCONNECTED:
        return DISCONNECTED
    if code == FunctionTimeoutError.code:
        return "timeout"
    if code == ConcurrencyLimitError.code:
        return "throttled"
    return "error"


class InvocationStats:
    """Counters the route layer bumps once per invocation (event loop only)."""

    def __init__(self) -> None:
        self.functions: dict[TenantFunction, _PerFunction] = {}

    def record(self, spec: FunctionSpec, code: int | str, duration: float, stream: Any, events: int,
               invocation_id: str | None = None) -> None:
        function = (spec.tenant, spec.name)
        per = self.functions.get(function)
        if per is None:
            per = self.functions[function] = _PerFunction()
        key = "0" if code == 0 else str(code)  # (success, most calls: no formatting)
        per.codes[key] = per.codes.get(key, 0) + 1
        per.duration.observe_of(duration, invocation_id)
        if stream is not None:
            per.events += events
            per.bytes += stream.bytes_sent
            per.heartbeats += stream.pings
            if stream.first_event_at is not None:
                per.first_event.observe(stream.first_event_at - stream.opened_at)


class JobStats:
    """Finished jobs, counted once each by JobManager.on_final (off the invoke hot path)."""

    def __init__(self) -> None:
        self.finished: dict[tuple[str, str, str], int] = {}  # (tenant, function, status label) -> count
        self.duration: dict[TenantFunction, _Histogram] = {}  # started -> finished
        self.delay: dict[TenantFunction, _Histogram] = {}     # submitted -> started

    def job_ended(self, job: Job) -> None:
        key = (job.tenant, job.function, JOB_STATUS[job.status])
        self.finished[key] = self.finished.get(key, 0) + 1
        if job.started_at is None:
            return  # never ran (cancelled or timed out while queued): no run time, no delay
        function = (job.tenant, job.function)
        end = job.completed_at if job.completed_at is not None else job.started_at
        for table, value in ((self.duration, end - job.started_at), (self.delay, job.started_at - job.created_at)):
            histogram = table.get(function)
            if histogram is None:
                histogram = table[function] = _Histogram(JOB_BUCKETS)
            histogram.observe(max(0.0, value))


METRICS = web.AppKey("metrics", InvocationStats)
JOB_METRICS = web.AppKey("job_metrics", JobStats)


def _code_of(inv: Any, response: web.StreamResponse | None) -> int | str:
    """How the invocation ended, as an error code (0 = success) or 'disconnected'."""
    if inv.cancel_reason == CLIENT_GONE or (response is not None and response.status == 499):
        return DISCONNECTED
    if getattr(inv, "timed_out", None):
        return FunctionTimeoutError.code
    aborted: FunctionServiceError | None = getattr(inv, "abort_error", None)  # fnstream stopped it (shutdown)
    if aborted is not None:
        return aborted.code
    task = getattr(inv, "task", None)
    if task is not None and task.done() and not task.cancelled():
        exc = task.exception()
        if isinstance(exc, FunctionServiceError):
            return exc.code
        if exc is not None:
            return 500
    if response is not None:
        inner = response.headers.get("X-Inner-Code")
        if inner and inner != "0":
            return inner
        if response.status >= 400:
            return response.status
    return 0


def count_refused(stats: InvocationStats | None, request: web.BaseRequest, code: int | str, started: float,
                  spec: FunctionSpec | None = None, inv: Any = None) -> None:
    """Count an invoke route that ended with an error or lost its client before answering (its
    invocation's: `inv` or `request[INVOCATION]`, or, refused before one started (404 aside), its
    function's: `spec`, or else `request[FUNCTION]`). `stats` is the app's (None: metrics.enabled false)."""
    if inv is None:
        inv = request.get(INVOCATION)
    if inv is not None:
        _record(stats, request, inv, code, started)
        return
    if spec is None:
        spec = request.get(FUNCTION)
    if spec is not None and stats is not None:
        stats.record(spec, code, monotonic() - started, None, 0)


def count_answered(stats: InvocationStats | None, request: web.BaseRequest, response: web.StreamResponse,
                   started: float) -> None:
    """Count the invocation an invoke route answered with `response` (how it ended: `_code_of`)."""
    inv = request.get(INVOCATION)
    if inv is not None:
        _record(stats, request, inv, _code_of(inv, response), started)


def _record(stats: InvocationStats | None, request: web.BaseRequest, inv: Any, code: int | str,
            started: float) -> None:
    if stats is None:
        return  # metrics.enabled: false
    stream = request.get(CURRENT_STREAM) if inv.streaming else None
    stats.record(inv.spec, code, monotonic() - started, stream, stream.events if stream is not None else 0,
                 inv.id)
