"""Fault: Redis restarted between bursts. The nodes' pooled connections to the old process are
stale; the first burst after the restart used to fail 503 (the asyncio client was given redis-py's
sync Retry, which never retries), now each stale connection is replaced and the command retried."""
from __future__ import annotations

import asyncio

import aiohttp

from tests.support.cluster import RELAY, deploy, serving, sse, status, wait_until, workers_serving

INVOKE = "/serverless/v1/functions/relay/invocations"
STREAMS = "/serverless/v1/streams"
BURST = 30


async def _burst(s: aiohttp.ClientSession, base: str) -> list[int]:
    async def json_call(i: int) -> int:
        async with s.post(base + INVOKE, json={"count": 1, "n": i}) as r:
            await r.read()
            return r.status

    async def publish(i: int) -> int:
        async with s.post(f"{base}{STREAMS}/after-restart", json=[f"e{i}"]) as r:
            await r.read()
            return r.status

    async def stream(i: int) -> int:
        code, events = await sse(s, base, "relay", {"count": 2, "delay_ms": 0})
        return code if len(events) >= 2 else -1

    calls = [f(i) for i in range(BURST) for f in (json_call, publish, stream)]
    return list(await asyncio.gather(*calls))


async def test_every_request_succeeds_after_a_redis_restart(redis_server, start_server, start_worker):
    async with serving(redis_server.url, start_server, start_worker) as cluster:
        s, frontend = cluster.session, cluster.frontend
        assert set(await _burst(s, frontend.url)) == {200}   # fills the connection pools
        redis_server.kill()
        redis_server.start()
        await deploy(s, frontend.url, RELAY, method="PUT")  # the registry is back too

        async def ready():
            return (await status(s, frontend.url))["redisReachable"]
        await wait_until(ready, "the frontend to see Redis again")
        await workers_serving(s, frontend.url, "relay")
        await asyncio.sleep(6)   # past health_check_interval: every pooled connection is idle and stale
        codes = await _burst(s, frontend.url)
    assert codes.count(200) == len(codes), codes
