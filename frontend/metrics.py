"""`GET /metrics`: Prometheus text exposition (prometheus_client) of invocations, streams, pools, cluster.

Cheap on the hot path: the invoke routes (`@counted`) only add to plain ints and histogram buckets in
`InvocationStats` (everything runs on the event loop thread, so no locks); the rest (inflight,
named streams, worker pools, cluster queues) is read from the runtime's own state at scrape
time by a custom collector. prometheus_client writes the exposition format.

Auth: the `developer` role, or anyone with `metrics.public: true`.
"""
from __future__ import annotations

import asyncio
import bisect
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from time import monotonic
from typing import Any, Concatenate, ParamSpec

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from runtime.errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError
from runtime.streams import StreamStats

from .keys import BROKER, CONFIG, EXECUTOR, REGISTRY
from .sse import CURRENT_STREAM

__all__ = ("InvocationStats", "METRICS", "INVOCATION", "FUNCTION", "counted", "install_metrics", "routes")

log = logging.getLogger("fnstream.frontend")
routes = web.RouteTableDef()

# The invocation a request started (set by the invoke routes' start_invocation).
INVOCATION = web.RequestKey("invocation", object)
# The function an invoke route is about to run: a call refused before it started (429) has no invocation.
FUNCTION = web.RequestKey("function", str)

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
FIRST_EVENT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
DISCONNECTED = "disconnected"


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


class _PerFunction:
    __slots__ = ("bytes", "duration", "events", "first_event", "heartbeats")

    def __init__(self) -> None:
        self.duration = _Histogram(DURATION_BUCKETS)
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
        self.invocations: dict[tuple[str, str], int] = {}  # (function, code) -> count
        self.functions: dict[str, _PerFunction] = {}

    def record(self, function: str, code: int | str, duration: float, stream: Any, events: int) -> None:
        key = (function, str(code))
        self.invocations[key] = self.invocations.get(key, 0) + 1
        per = self.functions.get(function)
        if per is None:
            per = self.functions[function] = _PerFunction()
        per.duration.observe(duration)
        if stream is not None:
            per.events += events
            per.bytes += stream.bytes_sent
            per.heartbeats += stream.pings
            if stream.first_event_at is not None:
                per.first_event.observe(stream.first_event_at - stream.opened_at)


METRICS = web.AppKey("metrics", InvocationStats)


def _code_of(request: web.Request, inv: Any, response: web.StreamResponse | None) -> int | str:
    """How the invocation ended, as an error code (0 = success) or 'disconnected'."""
    if inv.cancel_reason == "client disconnected" or (response is not None and response.status == 499):
        return DISCONNECTED
    if getattr(inv, "timed_out", None):
        return FunctionTimeoutError.code
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


P = ParamSpec("P")
Route = Callable[Concatenate[web.Request, P], Awaitable[web.StreamResponse]]


def counted(route: Route[P]) -> Route[P]:
    """Wrap an invoke route's core (`(request, ...) -> response`): count the invocation it started
    once it has answered, failed, or lost its client. A decorator, not a middleware: only the
    invoke paths pay for it, and nothing is wrapped per request."""

    @functools.wraps(route)
    async def run(request: web.Request, /, *args: P.args, **kwargs: P.kwargs) -> web.StreamResponse:
        started = monotonic()
        try:
            response = await route(request, *args, **kwargs)
        except asyncio.CancelledError:
            _maybe_record(request, DISCONNECTED, started)
            raise
        except FunctionServiceError as exc:
            _maybe_record(request, exc.code, started)
            raise
        inv = request.get(INVOCATION)
        if inv is not None:
            _record(request, inv, _code_of(request, inv, response), started)
        return response

    return run


def _maybe_record(request: web.Request, code: int | str, started: float) -> None:
    inv = request.get(INVOCATION)
    if inv is not None:
        _record(request, inv, code, started)
        return
    name, stats = request.get(FUNCTION), request.app.get(METRICS)
    if name is not None and stats is not None:
        stats.record(name, code, monotonic() - started, None, 0)


def _record(request: web.Request, inv: Any, code: int | str, started: float) -> None:
    stats = request.app.get(METRICS)
    if stats is None:
        return  # metrics.enabled: false
    stream = request.get(CURRENT_STREAM) if inv.streaming else None
    stats.record(inv.spec.name, code, monotonic() - started, stream, stream.events if stream is not None else 0)


class _Snapshot(Collector):
    """What one scrape reports: the route-layer counters plus runtime state read just now."""

    def __init__(self, stats: InvocationStats, app: web.Application, streams: list[StreamStats],
                 cluster: dict[str, Any] | None) -> None:
        self.stats, self.app, self.streams, self.cluster = stats, app, streams, cluster

    def collect(self) -> Iterator[Metric]:
        yield from self._invocations()
        yield from self._functions()
        yield from self._streams()
        yield from self._loop()
        if self.cluster is not None:
            yield from self._cluster(self.cluster)

    def _invocations(self) -> Iterator[Metric]:
        total = CounterMetricFamily("fnstream_invocations", "Invocations that ended, by function, outcome "
                                    "(ok, error, timeout, throttled, disconnected) and error code (0 = ok)",
                                    labels=["function", "outcome", "code"])
        by_outcome: dict[str, dict[str, int]] = {"timeout": {}, "throttled": {}, DISCONNECTED: {}}
        for (function, code), count in sorted(self.stats.invocations.items()):
            outcome = outcome_of(0 if code == "0" else (DISCONNECTED if code == DISCONNECTED else _int(code)))
            total.add_metric([function, outcome, code], count)
            if outcome in by_outcome:
                by_outcome[outcome][function] = by_outcome[outcome].get(function, 0) + count
        yield total
        for name, outcome, doc in (("fnstream_timeouts", "timeout", "Invocations that hit their function's timeout"),
                                   ("fnstream_throttled", "throttled", "Invocations refused with 429 (concurrency)"),
                                   ("fnstream_client_disconnects", DISCONNECTED,
                                    "Invocations whose client left before the answer ended")):
            family = CounterMetricFamily(name, doc, labels=["function"])
            for function, count in sorted(by_outcome[outcome].items()):
                family.add_metric([function], count)
            yield family

    def _functions(self) -> Iterator[Metric]:
        per = sorted(self.stats.functions.items())
        duration = HistogramMetricFamily("fnstream_invocation_duration_seconds",
                                         "Time from the request's arrival to the end of its answer",
                                         labels=["function"])
        first = HistogramMetricFamily("fnstream_time_to_first_event_seconds",
                                      "Streamed answers: time until the first event went out", labels=["function"])
        events = CounterMetricFamily("fnstream_stream_events", "Events streamed to clients", labels=["function"])
        sent = CounterMetricFamily("fnstream_stream_bytes", "Bytes of streamed answers", labels=["function"])
        pings = CounterMetricFamily("fnstream_heartbeats", "Heartbeat comments sent on streamed answers",
                                    labels=["function"])
        for function, p in per:
            duration.add_metric([function], p.duration.buckets(), p.duration.total)
            if p.first_event.counts[-1] or any(p.first_event.counts):
                first.add_metric([function], p.first_event.buckets(), p.first_event.total)
            events.add_metric([function], p.events)
            sent.add_metric([function], p.bytes)
            pings.add_metric([function], p.heartbeats)
        yield from (duration, first, events, sent, pings)
        inflight = GaugeMetricFamily("fnstream_inflight", "Invocations running now", labels=["function"])
        instances = GaugeMetricFamily("fnstream_pool_instances", "Worker processes of a process function",
                                      labels=["function"])
        busy = GaugeMetricFamily("fnstream_pool_busy", "Worker processes running an invocation", labels=["function"])
        restarts = CounterMetricFamily("fnstream_pool_restarts", "Worker processes replaced after dying",
                                       labels=["function"])
        for dep in self.app[REGISTRY].list():
            inflight.add_metric([dep.name], dep.inflight)
            if dep.pool is not None:
                pool = dep.pool.describe()
                instances.add_metric([dep.name], pool.get("instances", 0))
                busy.add_metric([dep.name], sum(1 for w in pool.get("workers", []) if w.get("state") == "busy"))
                restarts.add_metric([dep.name], pool.get("restarts", 0))
        yield from (inflight, instances, busy, restarts)

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
        for s in self.streams:
            tenant, _, name = s.name.partition("/")
            produced.add_metric([tenant, name], s.produced)
            delivered.add_metric([tenant, name], s.delivered)
            dropped.add_metric([tenant, name], s.dropped)
            subscribers.add_metric([tenant, name], s.consumers)
            producers.add_metric([tenant, name], s.producers)
            retained.add_metric([tenant, name], s.retained_bytes)
        count = GaugeMetricFamily("fnstream_streams", "Named streams known")
        count.add_metric([], len(self.streams))
        yield from (produced, delivered, dropped, subscribers, producers, retained, count)

    @staticmethod
    def _cluster(cluster: dict[str, Any]) -> Iterator[Metric]:
        alive = GaugeMetricFamily("fnstream_cluster_workers_alive", "Worker nodes with a live heartbeat")
        alive.add_metric([], cluster["workers"])
        depth = GaugeMetricFamily("fnstream_cluster_queue_depth", "Queued invocations not yet taken by a worker",
                                  labels=["function"])
        for function, n in sorted(cluster["queues"].items()):
            depth.add_metric([function], n)
        reachable = GaugeMetricFamily("fnstream_cluster_redis_reachable", "1 when Redis answered the last check")
        reachable.add_metric([], 1 if cluster["reachable"] else 0)
        yield from (alive, depth, reachable)


def _int(code: str) -> int | str:
    try:
        return int(code)
    except ValueError:
        return code


async def _cluster_state(app: web.Application) -> dict[str, Any] | None:
    from .cluster import CLUSTER

    node = app.get(CLUSTER)
    if node is None:
        return None
    queues: dict[str, int] = {}
    try:
        for function in sorted(node.sync.specs):
            queues[function] = await _queue_depth(node, function)
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


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    app = request.app
    streams = await app[BROKER].list()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(app[METRICS], app, streams, await _cluster_state(app)))
    body = generate_latest(registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def install_metrics(app: web.Application) -> None:
    """Count invocations and serve /metrics, unless `metrics.enabled: false`."""
    if not app[CONFIG].metrics.enabled:
        return
    app[METRICS] = InvocationStats()
    app.add_routes(routes)
