"""Cluster mode on a real 3-master Redis Cluster (`redis+cluster://` URL): one frontend, one worker."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.support.cluster import RELAY, deploy, frontend_args, sse, workers_serving
from tests.support.servers import assert_live, read_events


async def test_invoke_and_named_stream_over_a_redis_cluster(redis_cluster, start_server, start_worker):
    a = start_server(*frontend_args(redis_cluster.url))
    worker = start_worker(redis_cluster.url)
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        await workers_serving(s, a.url, "relay")
        await workers_serving(s, a.url, "stream-producer")

        # SSE through the worker, events arriving as produced
        code, got = await sse(s, a.url, "relay", {"count": 5, "delay_ms": 300})
        data = [d for _, d in got]
        assert code == 200 and data[-1] == "[DONE]"
        assert [json.loads(d)["i"] for d in data[:5]] == [1, 2, 3, 4, 5]
        assert {json.loads(d)["pid"] for d in data[:5]} == {worker.pid}
        assert_live([t for t, _ in got[:5]], 1.2)

        # a named stream subscribed on the frontend, produced by a function on the worker
        sub = await s.get(a.url + "/serverless/v1/stream/subscribe",
                          headers={"X-Stream-Name": "clustered", "X-Timeout-Ms": "20000"})
        assert sub.status == 200
        reading = asyncio.ensure_future(read_events(sub))
        async with s.post(a.url + "/serverless/v1/functions/stream-producer/invocations",
                          json={"stream": "clustered", "count": 4, "delay_ms": 200}) as inv:
            assert inv.status == 200, await inv.text()
        stamps, events = map(list, zip(*await asyncio.wait_for(reading, 10), strict=True))
        sub.close()
    assert [e["id"] for e in events] == ["1", "2", "3", "4", "5"] and events[-1]["data"] == "[DONE]"
    assert_live(stamps[:4], 0.6)

    # the keys really are spread over the cluster's masters, each on its hash-tagged slot
    client = redis_cluster.client()
    keys = {k for k in client.scan_iter(match="fnstream:*", target_nodes=client.PRIMARIES)}
    assert {"fnstream:{queue:relay}", "fnstream:{stream:default/clustered}:s", "fnstream:{registry}:functions"} <= keys
    owners = {client.get_node_from_key(k).port for k in keys}
    assert len(owners) >= 2, owners
    assert not [k for k in keys if "{inv:" in k]          # per-invocation keys went away
