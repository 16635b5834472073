"""The scrape collector of /metrics: the hot-path counters plus runtime state read at scrape time.

Inflight, jobs by status, sessions, named streams, worker pools and the event loop are read from
the runtime's own state when a scrape runs, not kept up to date on the invoke path; prometheus_client
writes the exposition format. A tenant boundary: every series that names something carries its
`tenant` label, and a collector for one tenant yields only that tenant's samples (filtered while
the families are built, nothing copied). A scrape reports the series of `metrics.maxFunctions`
functions at most (the most invoked first), so its cost and size stop growing with the number
of functions deployed; `fnstream_metrics_functions_omitted` says how many were left out.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.deployment import Deployment
from runtime.streams import StreamStats

from .jobs import JOBS
from .keys import CONFIG, EXECUTOR, REGISTRY
from .metrics_cluster import cluster_families
from .metrics_counters import (
    DISCONNECTED,
    FUNCTION_LABELS,
    JOB_METRICS,
    JOB_STATUS,
    METRICS,
    TenantFunction,
    outcome_of,
)

__all__ = ("Snapshot",)


class Snapshot(Collector):
    """What one scrape reports: the route-layer counters plus runtime state read just now, only of
    `tenant` (None: every tenant's)."""

    def __init__(self, app: web.Application, streams: list[StreamStats], cluster: dict[str, Any] | None,
                 tenant: str | None) -> None:
        self.stats, self.app, self.streams, self.cluster, self.tenant = app[METRICS], app, streams, cluster, tenant
        self._shown, self.omitted = self._bounded(app[CONFIG].metrics.maxFunctions)

    def _mine(self, tenant: str) -> bool:
        return self.tenant is None or tenant == self.tenant

    def _bounded(self, limit: int | None) -> tuple[set[TenantFunction] | None, int]:
        """The functions whose series this scrape reports (None: all) and how many it leaves out."""
        known = {key: sum(per.codes.values()) for key, per in self.stats.functions.items() if self._mine(key[0])}
        for dep in self.app[REGISTRY].list():
            if self._mine(dep.spec.tenant):
                known.setdefault((dep.spec.tenant, dep.name), 0)
        if limit is None or len(known) <= limit:
            return None, 0
        ranked = sorted(known.items(), key=lambda kv: (-kv[1], kv[0]))  # the most invoked, then by name
        return {key for key, _n in ranked[:limit]}, len(known) - limit

    def _fn(self, tenant: str, function: str) -> bool:
        """Whether a series of `function` is reported: the scraper's tenant's, and within the bound."""
        return self._mine(tenant) and (self._shown is None or (tenant, function) in self._shown)

    def _deployments(self) -> list[Deployment]:
        return [d for d in self.app[REGISTRY].list() if self._fn(d.spec.tenant, d.name)]

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("fnstream_metrics_functions_omitted", "Functions this scrape reports no series "
                                "of (past metrics.maxFunctions; the least invoked)", value=self.omitted)
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
            yield from cluster_families(self.cluster)

    def _invocations(self) -> Iterator[Metric]:
        total = CounterMetricFamily("fnstream_invocations", "Invocations that ended, by function, outcome "
                                    "(ok, error, timeout, throttled, disconnected) and error code (0 = ok)",
                                    labels=["tenant", "function", "outcome", "code"])
        by_outcome: dict[str, dict[TenantFunction, int]] = {"timeout": {}, "throttled": {}, DISCONNECTED: {}}
        counts = ((key, code, n) for key, per in self.stats.functions.items() for code, n in per.codes.items())
        for (tenant, function), code, count in sorted(counts):
            if not self._fn(tenant, function):
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
            if not self._fn(*key):
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
                                      "table was full, or an exclusive share was refused (429)", labels=FUNCTION_LABELS)
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
            if self._fn(job.tenant, job.function):
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
            if self._fn(tenant, function):
                total.add_metric([tenant, function, status], n)
        duration = HistogramMetricFamily("fnstream_job_duration_seconds", "Finished jobs: from start to end",
                                         labels=FUNCTION_LABELS)
        delay = HistogramMetricFamily("fnstream_job_delay_seconds", "Finished jobs: from submit to start (queued)",
                                      labels=FUNCTION_LABELS)
        for family, table in ((duration, finished.duration), (delay, finished.delay)):
            for key, histogram in sorted(table.items()):
                if self._fn(*key):
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


def _int(code: str) -> int | str:
    try:
        return int(code)
    except ValueError:
        return code
