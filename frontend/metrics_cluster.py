"""Cluster figures for /metrics: live workers, queue depths (Redis XINFO), Redis reachability.

Queue depths are read for `metrics.maxFunctions` functions at most (the most invoked), as the
collector reports series of: one Redis read each. Apart from the collector because these are read
from Redis before a scrape's families are built
(awaited: the collector itself is synchronous), and only in cluster mode; redis is reached only
through the cluster node, never imported by the plain server.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric

from runtime.manifest import FunctionSpec

from .keys import CONFIG
from .metrics_counters import FUNCTION_LABELS, METRICS, TenantFunction

__all__ = ("cluster_families", "cluster_state")

log = logging.getLogger("fnstream.frontend")


async def cluster_state(app: web.Application, tenant: str | None) -> dict[str, Any] | None:
    from .cluster import CLUSTER

    node = app.get(CLUSTER)
    if node is None:
        return None
    queues: dict[TenantFunction, int] = {}
    mine = [(key, spec) for key, spec in node.sync.specs.items()  # key: function_key(tenant, name)
            if tenant is None or spec.tenant == tenant]
    limit = app[CONFIG].metrics.maxFunctions
    if limit is not None and len(mine) > limit:  # one Redis read a function: the most invoked ones only
        stats = app[METRICS].functions

        def invoked(item: tuple[str, FunctionSpec]) -> tuple[int, str]:
            per = stats.get((item[1].tenant, item[1].name))
            return -(sum(per.codes.values()) if per is not None else 0), item[0]
        mine = sorted(mine, key=invoked)[:limit]
    try:
        for key, spec in sorted(mine):
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


def cluster_families(cluster: dict[str, Any]) -> Iterator[Metric]:
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
