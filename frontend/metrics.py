"""`GET /metrics`: Prometheus text exposition (prometheus_client) of invocations, streams, jobs,
sessions, pools, cluster; OpenMetrics, with the invocation duration's exemplars naming invocation
ids, when the scrape's `Accept` asks for `application/openmetrics-text`.

Cheap on the hot path: the invoke routes (their `@invocation_route`, frontend/respond.py) only add
to plain ints and histogram buckets in `InvocationStats` (everything runs on the event loop thread,
so no locks); finished jobs are counted by the job manager's `on_final` hook; the rest (inflight,
jobs by status, sessions, named streams, worker pools, cluster queues) is read from the runtime's
own state at scrape time by a custom
collector. prometheus_client writes the exposition format.

A tenant boundary: every series that names something carries its `tenant` label, and the collector
of a scrape by a non-admin token yields only that tenant's samples (filtered while the families are
built, nothing copied). `admin`, no auth, and `metrics.public: true` see every tenant.
"""
from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator
from time import monotonic
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from runtime.deployment import Deployment
from runtime.errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError
from runtime.jobs.model import Job
from runtime.manifest import FunctionSpec
from runtime.streams import StreamStats

from .auth import principal_of
from .jobs import JOBS
from .keys import BROKER, CONFIG, EXECUTOR, REGISTRY
from .sse import CURRENT_STREAM

__all__ = ("InvocationStats", "JobStats", "METRICS", "JOB_METRICS", "INVOCATION", "FUNCTION", "CLIENT_GONE",
           "DISCONNECTED", "count_answered", "count_refused", "install_metrics", "routes")

log = logging.getLogger("fnstream.frontend")
routes = web.RouteTableDef()

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


class _Snapshot(Collector):
    """What one scrape reports: the route-layer counters plus runtime state read just now, only of
    `tenant` (None: every tenant's)."""

    def __init__(self, app: web.Application, streams: list[StreamStats], cluster: dict[str, Any] | None,
                 tenant: str | None) -> None:
        self.stats, self.app, self.streams, self.cluster, self.tenant = app[METRICS], app, streams, cluster, tenant

    def _mine(self, tenant: str) -> bool:
        return self.tenant is None or tenant == self.tenant

    def _deployments(self) -> list[Deployment]:
        return [d for d in self.app[REGISTRY].list() if self._mine(d.spec.tenant)]

    def collect(self) -> Iterator[Metric]:
        yield from self._invocations()
        yield from self._functions()
        deps = self._deployments()
        yield from self._running(deps)
        yield from self._pools(deps)
        yield from self._sessions(deps)
        yield from self._jobs()
        yield from self._streams()
        yield from self._loop()
        if self.cluster is not None:
            yield from self._cluster(self.cluster)

    def _invocations(self) -> Iterator[Metric]:
        total = CounterMetricFamily("fnstream_invocations", "Invocations that ended, by function, outcome "
                                    "(ok, error, timeout, throttled, disconnected) and error code (0 = ok)",
                                    labels=["tenant", "function", "outcome", "code"])
        by_outcome: dict[str, dict[TenantFunction, int]] = {"timeout": {}, "throttled": {}, DISCONNECTED: {}}
        counts = ((key, code, n) for key, per in self.stats.functions.items() for code, n in per.codes.items())
        for (tenant, function), code, count in sorted(counts):
            if not self._mine(tenant):
                continue
            outcome = outcome_of(0 if code == "0" else (DISCONNECTED if code == DISCONNECTED else _int(code)))
            total.add_metric([tenant, function, outcome, code], count)
            if outcome in by_outcome:
                key = (tenant, function)
                by_outcome[outcome][key] = by_outcome[outcome].get(key, 0) + count
        yield total
        for name, outcome, doc in (("fnstream_timeouts", "timeout", "Invocations that hit their function's timeout"),
                                   ("fnstream_throttled", "throttled", "Invocations refused with 429 (concurrency)"),
                                   ("fnstream_client_disconnects", DISCONNECTED,
                                    "Invocations whose client left before the answer ended")):
            family = CounterMetricFamily(name, doc, labels=FUNCTION_LABELS)
            for key, count in sorted(by_outcome[outcome].items()):
                family.add_metric(list(key), count)
            yield family

    def _functions(self) -> Iterator[Metric]:
        duration = HistogramMetricFamily("fnstream_invocation_duration_seconds",
                                         "Time from the request's arrival to the end of its answer",
                                         labels=FUNCTION_LABELS)
        first = HistogramMetricFamily("fnstream_time_to_first_event_seconds",
                                      "Streamed answers: time until the first event went out", labels=FUNCTION_LABELS)
        events = CounterMetricFamily("fnstream_stream_events", "Events streamed to clients", labels=FUNCTION_LABELS)
        sent = CounterMetricFamily("fnstream_stream_bytes", "Bytes of streamed answers", labels=FUNCTION_LABELS)
        pings = CounterMetricFamily("fnstream_heartbeats", "Heartbeat comments sent on streamed answers",
                                    labels=FUNCTION_LABELS)
        for key, p in sorted(self.stats.functions.items()):
            if not self._mine(key[0]):
                continue
            labels = list(key)
            duration.add_metric(labels, p.duration.buckets_with_exemplars(), p.duration.total)
            if any(p.first_event.counts):
                first.add_metric(labels, p.first_event.buckets(), p.first_event.total)
            events.add_metric(labels, p.events)
            sent.add_metric(labels, p.bytes)
            pings.add_metric(labels, p.heartbeats)
        yield from (duration, first, events, sent, pings)

    @staticmethod
    def _running(deps: list[Deployment]) -> Iterator[Metric]:
        inflight = GaugeMetricFamily("fnstream_inflight", "Invocations running now", labels=FUNCTION_LABELS)
        threads = GaugeMetricFamily("fnstream_threads_busy", "Threads running a def handler of the function now",
                                    labels=FUNCTION_LABELS)
        overran = CounterMetricFamily("fnstream_threads_overran", "def handler threads that ran past their timeout",
                                      labels=FUNCTION_LABELS)
        for dep in deps:
            labels = [dep.spec.tenant, dep.name]
            inflight.add_metric(labels, dep.inflight)
            if dep.thread_gate is not None:
                threads.add_metric(labels, dep.thread_gate.busy)
                overran.add_metric(labels, dep.thread_gate.overran_total)
        yield from (inflight, threads, overran)

    @staticmethod
    def _pools(deps: list[Deployment]) -> Iterator[Metric]:
        instances = GaugeMetricFamily("fnstream_pool_instances", "Worker processes of a process function",
                                      labels=FUNCTION_LABELS)
        busy = GaugeMetricFamily("fnstream_pool_busy", "Worker processes running an invocation", labels=FUNCTION_LABELS)
        slots = GaugeMetricFamily("fnstream_pool_slots", "Invocation slots of the ready workers "
                                  "(instances x instanceConcurrency)", labels=FUNCTION_LABELS)
        busy_slots = GaugeMetricFamily("fnstream_pool_busy_slots", "Slots running an invocation now",
                                       labels=FUNCTION_LABELS)
        waiting = GaugeMetricFamily("fnstream_pool_waiting", "Invocations waiting for a free slot",
                                    labels=FUNCTION_LABELS)
        restarts = CounterMetricFamily("fnstream_pool_restarts", "Worker processes replaced after dying",
                                       labels=FUNCTION_LABELS)
        cold = CounterMetricFamily("fnstream_pool_cold_starts", "Workers started because an invocation found "
                                   "no free slot", labels=FUNCTION_LABELS)
        for dep in deps:
            if dep.pool is None:
                continue
            labels = [dep.spec.tenant, dep.name]
            pool = dep.pool.describe()
            workers = [w for w in pool.get("workers", []) if w.get("state") in ("busy", "idle")]
            instances.add_metric(labels, pool.get("instances", 0))
            busy.add_metric(labels, sum(1 for w in workers if w.get("state") == "busy"))
            slots.add_metric(labels, sum(w.get("slots", 0) for w in workers))
            busy_slots.add_metric(labels, sum(w.get("busySlots", 0) for w in workers))
            waiting.add_metric(labels, pool.get("waiting", 0))
            restarts.add_metric(labels, pool.get("restarts", 0))
            cold.add_metric(labels, pool.get("coldStarts", 0))
        yield from (instances, busy, slots, busy_slots, waiting, restarts, cold)

    @staticmethod
    def _sessions(deps: list[Deployment]) -> Iterator[Metric]:
        """X-Instance-Session sessions (runtime/sessions.py), read from each deployment's table."""
        open_now = GaugeMetricFamily("fnstream_sessions", "Instance sessions open now", labels=FUNCTION_LABELS)
        opened = CounterMetricFamily("fnstream_sessions_opened", "Instance sessions opened", labels=FUNCTION_LABELS)
        ended = CounterMetricFamily("fnstream_sessions_ended", "Instance sessions ended, by reason (expired: "
                                    "unused past their TTL; deleted: DELETE .../sessions/{id})",
                                    labels=[*FUNCTION_LABELS, "reason"])
        refused = CounterMetricFamily("fnstream_sessions_refused", "Sessions not opened: the function's session "
                                      "table was full (429)", labels=FUNCTION_LABELS)
        moved = CounterMetricFamily("fnstream_sessions_moved", "Sessions whose pinned worker died; the next turn ran "
                                    "on another (its in-memory state lost)", labels=FUNCTION_LABELS)
        for dep in deps:
            labels = [dep.spec.tenant, dep.name]
            table = dep.sessions
            table.sweep()  # at most once a second: expired sessions are ended, as any use of the table does
            open_now.add_metric(labels, len(table))
            opened.add_metric(labels, table.opened)
            ended.add_metric([*labels, "expired"], table.expired)
            ended.add_metric([*labels, "deleted"], table.deleted)
            refused.add_metric(labels, table.refused)
            if dep.pool is not None:
                moved.add_metric(labels, dep.pool.sessions_moved)
        yield from (open_now, opened, ended, refused, moved)

    def _jobs(self) -> Iterator[Metric]:
        """Background jobs of this node (runtime/jobs): now by status, and the finished ones' totals."""
        manager, finished = self.app.get(JOBS), self.app.get(JOB_METRICS)
        if manager is None or finished is None:
            return
        now: dict[TenantFunction, dict[str, int]] = {}
        for job in manager.jobs.values():
            if self._mine(job.tenant):
                counts = now.setdefault((job.tenant, job.function), dict.fromkeys(JOB_STATUS.values(), 0))
                counts[JOB_STATUS[job.status]] += 1
        jobs = GaugeMetricFamily("fnstream_jobs", "Jobs this node holds now (finished ones until jobs."
                                 "retentionSeconds), by status", labels=[*FUNCTION_LABELS, "status"])
        for key, counts in sorted(now.items()):
            for status, n in counts.items():
                jobs.add_metric([*key, status], n)
        total = CounterMetricFamily("fnstream_jobs_finished", "Jobs that reached a final status",
                                    labels=[*FUNCTION_LABELS, "status"])
        for (tenant, function, status), n in sorted(finished.finished.items()):
            if self._mine(tenant):
                total.add_metric([tenant, function, status], n)
        duration = HistogramMetricFamily("fnstream_job_duration_seconds", "Finished jobs: from start to end",
                                         labels=FUNCTION_LABELS)
        delay = HistogramMetricFamily("fnstream_job_delay_seconds", "Finished jobs: from submit to start (queued)",
                                      labels=FUNCTION_LABELS)
        for family, table in ((duration, finished.duration), (delay, finished.delay)):
            for key, histogram in sorted(table.items()):
                if self._mine(key[0]):
                    family.add_metric(list(key), histogram.buckets(), histogram.total)
        # node-wide (a job-store failure is the store's, not one tenant's): shown to every scraper
        failed = CounterMetricFamily("fnstream_job_store_failures", "Jobs failed because the job store refused "
                                     "a write of theirs (disk full, read-only), after retries",
                                     value=manager.writes.failures)
        refused = CounterMetricFamily("fnstream_job_store_refused_writes", "Job-store writes refused, retries "
                                      "and submits answered 507 included", value=manager.writes.refused)
        yield from (jobs, total, duration, delay, failed, refused)

    def _loop(self) -> Iterator[Metric]:
        """The event loop's lateness (runtime/limits.py LoopLagMonitor): a stall held every request."""
        monitor = self.app[EXECUTOR].loop_monitor
        yield GaugeMetricFamily("fnstream_loop_lag_seconds", "How late the loop-lag timer fired last",
                                value=monitor.last_lag)
        yield GaugeMetricFamily("fnstream_loop_lag_max_seconds", "Largest loop lag seen", value=monitor.max_lag)
        yield CounterMetricFamily("fnstream_loop_stalls", "Event-loop stalls over the monitor's threshold",
                                  value=monitor.stalls)
        yield CounterMetricFamily("fnstream_loop_stall_seconds", "Seconds the event loop was stalled",
                                  value=monitor.total_stall_seconds)

    def _streams(self) -> Iterator[Metric]:
        labels = ["tenant", "stream"]  # broker names are `<tenant>/<name>` (runtime/streams/tenancy.py)
        produced = CounterMetricFamily("fnstream_stream_produced", "Elements published into a named stream",
                                       labels=labels)
        delivered = CounterMetricFamily("fnstream_stream_delivered", "Elements delivered to subscribers", labels=labels)
        dropped = CounterMetricFamily("fnstream_stream_dropped", "Elements dropped (slow subscribers cut, retention)",
                                      labels=labels)
        subscribers = GaugeMetricFamily("fnstream_stream_subscribers", "Subscribers of a named stream now",
                                        labels=labels)
        producers = GaugeMetricFamily("fnstream_stream_producers", "Producers attached to a named stream",
                                      labels=labels)
        retained = GaugeMetricFamily("fnstream_stream_retained_bytes", "Bytes a named stream retains for replay",
                                     labels=labels)
        per_tenant: dict[str, int] = {}
        for s in self.streams:
            tenant, _, name = s.name.partition("/")
            if not self._mine(tenant):
                continue
            per_tenant[tenant] = per_tenant.get(tenant, 0) + 1
            produced.add_metric([tenant, name], s.produced)
            delivered.add_metric([tenant, name], s.delivered)
            dropped.add_metric([tenant, name], s.dropped)
            subscribers.add_metric([tenant, name], s.consumers)
            producers.add_metric([tenant, name], s.producers)
            retained.add_metric([tenant, name], s.retained_bytes)
        count = GaugeMetricFamily("fnstream_streams", "Named streams known", labels=["tenant"])
        for tenant, n in sorted(per_tenant.items()):
            count.add_metric([tenant], n)
        yield from (produced, delivered, dropped, subscribers, producers, retained, count)

    @staticmethod
    def _cluster(cluster: dict[str, Any]) -> Iterator[Metric]:
        """Node-wide figures name nothing of a tenant; the queue depths are of the scraper's tenant only."""
        alive = GaugeMetricFamily("fnstream_cluster_workers_alive", "Worker nodes with a live heartbeat")
        alive.add_metric([], cluster["workers"])
        depth = GaugeMetricFamily("fnstream_cluster_queue_depth", "Queued invocations not yet taken by a worker",
                                  labels=FUNCTION_LABELS)
        for key, n in sorted(cluster["queues"].items()):
            depth.add_metric(list(key), n)
        reachable = GaugeMetricFamily("fnstream_cluster_redis_reachable", "1 when Redis answered the last check")
        reachable.add_metric([], 1 if cluster["reachable"] else 0)
        yield from (alive, depth, reachable)


def _int(code: str) -> int | str:
    try:
        return int(code)
    except ValueError:
        return code


async def _cluster_state(app: web.Application, tenant: str | None) -> dict[str, Any] | None:
    from .cluster import CLUSTER

    node = app.get(CLUSTER)
    if node is None:
        return None
    queues: dict[TenantFunction, int] = {}
    try:
        for key, spec in sorted(node.sync.specs.items()):  # key: function_key(tenant, name)
            if tenant is None or spec.tenant == tenant:
                queues[(spec.tenant, spec.name)] = await _queue_depth(node, key)
    except Exception as exc:
        log.info("metrics: cannot read cluster queues: %s", exc)
    return {"workers": len(node.workers), "queues": queues, "reachable": node.redis_reachable}


async def _queue_depth(node: Any, function: str) -> int:
    """Entries of the function's queue no worker has taken yet (the consumer group's lag)."""
    from runtime.cluster.settings import Keys

    try:
        groups = await node.redis.xinfo_groups(node.keys.queue(function))
    except Exception:
        return 0
    for group in groups:
        name = group.get("name")
        if name in (Keys.GROUP, Keys.GROUP.encode()):
            lag = group.get("lag")
            return int(lag) if lag is not None else 0
    return 0


def _scope(request: web.Request) -> str | None:
    """Whose samples this scrape gets: the token's tenant, or everyone's (None) for `admin`, for
    `metrics.public: true` (the operator's choice: every tenant's names to anyone) and with auth off."""
    principal = principal_of(request)
    if principal is None or principal.role == "admin" or request.app[CONFIG].metrics.public:
        return None
    return principal.tenant


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    app = request.app
    tenant = _scope(request)
    streams = await app[BROKER].list()
    registry = CollectorRegistry(auto_describe=False)  # a holder for this scrape's collector, nothing copied
    registry.register(_Snapshot(app, streams, await _cluster_state(app, tenant), tenant))
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    if not content_type.startswith("application/openmetrics-text"):  # the text format (no exemplars) as before
        encoder, content_type = generate_latest, CONTENT_TYPE_LATEST
    return web.Response(body=encoder(registry), headers={"Content-Type": content_type})


def install_metrics(app: web.Application) -> None:
    """Count invocations (and finished jobs) and serve /metrics, unless `metrics.enabled: false`."""
    if not app[CONFIG].metrics.enabled:
        return
    app[METRICS] = InvocationStats()
    app[JOB_METRICS] = job_stats = JobStats()

    async def count_jobs(app: web.Application) -> None:
        manager = app.get(JOBS)  # attached after the metrics, by frontend/app.py
        if manager is not None:
            manager.on_final.append(job_stats.job_ended)

    app.on_startup.append(count_jobs)
    app.add_routes(routes)
