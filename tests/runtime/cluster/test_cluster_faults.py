"""Fault: Redis stopped and restarted while a cluster-mode subscriber streams. The client sees the
elements published before, then a clear end (never a silent hang); after the restart the node
serves again."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from frontend.client import iter_sse
from tests.support.cluster import RELAY, deploy, frontend_args, wait_until, workers_serving

STREAMS = "/serverless/v1/streams"


async def test_redis_restart_mid_stream(redis_server, start_server):
    node = start_server(*frontend_args(redis_server.url, role="all"))
    async with aiohttp.ClientSession() as s:
        sub = await s.get(f"{node.url}{STREAMS}/fragile", headers={"X-Timeout-Ms": "30000"})
        reading = asyncio.ensure_future(_events(sub))
        await asyncio.sleep(0.5)
        async with s.post(f"{node.url}{STREAMS}/fragile", json=["before-1", "before-2"]) as r:
            assert r.status == 200
        await asyncio.sleep(0.5)
        redis_server.kill()
        async with s.post(f"{node.url}{STREAMS}/fragile", json=["during"]) as r:
            assert r.status == 503 and (await r.json())["code"]       # refused, not lost silently
        events = await asyncio.wait_for(reading, 30)
        redis_server.start()
        for _ in range(100):
            async with s.post(f"{node.url}{STREAMS}/fragile", json=["after"]) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.1)
        assert r.status == 200
    data = [e["data"] for e in events]
    assert data[:2] == ["before-1", "before-2"]
    assert events[-1].get("event") == "error", events
    assert "Redis" in json.loads(events[-1]["data"])["message"]


async def _events(resp: aiohttp.ClientResponse) -> list[dict]:
    return [e async for e in iter_sse(resp)]


async def test_a_worker_stops_a_stream_whose_frontend_is_gone(redis_server, start_server, start_worker):
    """The frontend relaying a stream is killed: nothing acks its output, nor renews its TTL, any
    more. The worker used to wait for acks until the function's timeout, its handler and slot held;
    it stops it once its output stream expired (cluster.outputTtlSeconds). A live frontend whose
    client stalls keeps it alive (test_cluster.py: a client stalled past the TTL loses nothing)."""
    ttl = ["-s", "cluster.outputTtlSeconds=2"]
    frontend = start_server(*frontend_args(redis_server.url), *ttl)
    worker = start_worker(redis_server.url, *ttl)
    async with aiohttp.ClientSession() as s:
        await deploy(s, frontend.url, {**RELAY, "timeout": 300})
        await workers_serving(s, frontend.url, "relay")
        async with s.post(f"{frontend.url}/serverless/v1/functions/relay/invocations",
                          json={"count": 10_000_000, "delay_ms": 0}, headers={"Accept": "text/event-stream"}) as r:
            assert r.status == 200
            await r.content.readline()  # the stream runs
            frontend.kill()

    async def stopped():
        return "its frontend stopped reading its output" in worker.output()
    await wait_until(stopped, "the worker to stop the orphaned stream", limit=30)
