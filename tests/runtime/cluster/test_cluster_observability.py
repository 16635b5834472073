"""Cluster mode: the caller's trace reaches the worker, and /metrics shows workers and queues."""
import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import CLUSTER_FUNCTIONS, FAST

TRACED = {"name": "traced", "handler": "traced.handler", "codePath": str(CLUSTER_FUNCTIONS), "timeout": 30}
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_trace_reaches_the_worker_and_metrics_show_the_cluster(redis_server, start_server, start_worker):
    front = start_server("--cluster", redis_server.url, *FAST, "-s", "cluster.role=frontend",
                         "-s", "metrics.maxFunctions=1", env={"FNSTREAM_LOG": "WARNING"})
    worker = start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        async with s.post(front.url + "/admin/v1/functions", json=TRACED) as r:
            assert r.status == 201, await r.text()
        for _ in range(300):  # readiness: a worker has picked the function up
            async with s.get(front.url + "/cluster/v1/status") as r:
                if any("traced" in w["functions"] for w in (await r.json())["workers"]):
                    break
            await asyncio.sleep(0.05)
        async with s.post(front.url + "/serverless/v1/functions/traced/invocations", json={},
                          headers={"traceparent": PARENT}) as r:
            assert r.status == 200
            body = await r.json()
            assert r.headers["traceparent"].split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert body == {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "pid": worker.pid}
        async with s.get(front.url + "/metrics") as r:
            text = await r.text()
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
               for f in text_string_to_metric_families(text) for x in f.samples}
    assert samples[("fnstream_cluster_workers_alive", ())] >= 1
    assert samples[("fnstream_cluster_queue_depth", (("function", "traced"), ("tenant", "default")))] == 0
    assert samples[("fnstream_cluster_redis_reachable", ())] == 1
    # metrics.maxFunctions: 1 - the queue of the one invoked function only is read (the bundled ones' are not)
    assert [labels for name, labels in samples if name == "fnstream_cluster_queue_depth"] == [
        (("function", "traced"), ("tenant", "default"))]
    assert samples[("fnstream_invocations_total", (("code", "0"), ("function", "traced"), ("outcome", "ok"),
                                                     ("tenant", "default")))] == 1
