"""`GET /metrics`: Prometheus text exposition (prometheus_client) of invocations, streams, jobs,
sessions, pools, cluster; OpenMetrics, with the invocation duration's exemplars naming invocation
ids, when the scrape's `Accept` asks for `application/openmetrics-text`.

The route and its installation only: the counters the invoke routes bump are
frontend/metrics_counters.py, what a scrape reports frontend/metrics_collector.py, the cluster's
queues frontend/metrics_cluster.py. A tenant boundary: the collector of a scrape by a non-admin
token yields only that tenant's samples; `admin`, no auth, and `metrics.public: true` see every tenant.
"""
from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder

from runtime.config import Config

from .auth import principal_of
from .keys import BROKER, CONFIG
from .metrics_cluster import cluster_state
from .metrics_collector import Snapshot
from .metrics_counters import JOB_METRICS, METRICS, InvocationStats, JobStats

__all__ = ("install_metrics", "job_metrics", "routes")

routes = web.RouteTableDef()


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
    registry.register(Snapshot(app, streams, await cluster_state(app, tenant), tenant))
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    if not content_type.startswith("application/openmetrics-text"):  # the text format (no exemplars) as before
        encoder, content_type = generate_latest, CONTENT_TYPE_LATEST
    return web.Response(body=encoder(registry), headers={"Content-Type": content_type})


def job_metrics(config: Config) -> JobStats | None:
    """The finished-job counters (None with `metrics.enabled: false`): made before the node, whose
    job manager is given their `job_ended` as a hook (runtime/node.py `job_hooks`)."""
    return JobStats() if config.metrics.enabled else None


def install_metrics(app: web.Application, job_stats: JobStats | None) -> None:
    """Count invocations (and finished jobs, in `job_stats`) and serve /metrics, unless
    `metrics.enabled: false` (then `job_stats` is None)."""
    if job_stats is None:
        return
    app[METRICS] = InvocationStats()
    app[JOB_METRICS] = job_stats
    app.add_routes(routes)
