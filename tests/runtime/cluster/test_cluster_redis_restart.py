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
        async def ready():
            return (await status(s, frontend.url))["redisReachable"]
        await wait_until(ready, "the frontend to see Redis again")
        await deploy(s, frontend.url, RELAY, method="PUT")  # the registry is back too
        await workers_serving(s, frontend.url, "relay")
        await asyncio.sleep(6)   # past health_check_interval: every pooled connection is idle and stale
        codes = await _burst(s, frontend.url)
    assert codes.count(200) == len(codes), codes


async def test_functions_not_yet_back_in_a_refilled_registry_are_published_not_deleted(redis_server, caplog):
    """Redis came back empty and node A has begun to publish again. Node B, which had applied both
    functions, publishes the one not back yet instead of taking it for deleted (it used to delete
    it, until A's next store brought it back: a window of 404s after a Redis restart)."""
    from runtime.cluster.registry_sync import RegistrySync
    from runtime.cluster.settings import Keys, connect
    from runtime.manifest import FunctionSpec
    from runtime.registry import Registry
    from tests.support.cluster import CLUSTER_FUNCTIONS

    specs = [FunctionSpec.model_validate({**RELAY, "name": name}) for name in ("f1", "f2")]
    a, b = (RegistrySync(connect(redis_server.url), Keys(), Registry([CLUSTER_FUNCTIONS]), node) for node in "ab")
    try:
        await a.push_initial()  # into an empty Redis: no epoch yet
        await a.registry.adeploy(specs)
        await a.flush()  # A's own store begins the epoch: no loss to recover from
        await a.sync()
        assert "was lost" not in caplog.text
        await b.push_initial()
        await b.sync()
        assert "f1" in b.registry and "f2" in b.registry
        redis_server.client().flushall()  # what a restart without persistence leaves
        await a._store("f1", specs[0])  # A has begun to publish again
        await b.sync()
        assert "f1" in b.registry and "f2" in b.registry
        assert set(redis_server.client().hkeys(Keys().functions)) == {"f1", "f2"}
    finally:
        for node in (a, b):
            await node.registry.stop_workers()
            await node.redis.aclose()


async def test_a_republish_cut_short_by_redis_is_finished_by_the_next_sync(redis_server):
    """Redis failed again while node B re-published its functions into a refilled registry. B's next
    sync finishes the job: it used to forget that the registry had been lost, adopt the new epoch
    and leave the functions it had not stored yet out of Redis for good."""
    import pytest

    from runtime.cluster.registry_sync import RegistrySync
    from runtime.cluster.settings import Keys, connect
    from runtime.manifest import FunctionSpec
    from runtime.registry import Registry
    from tests.support.cluster import CLUSTER_FUNCTIONS

    specs = [FunctionSpec.model_validate({**RELAY, "name": name}) for name in ("f1", "f2")]
    a, b = (RegistrySync(connect(redis_server.url), Keys(), Registry([CLUSTER_FUNCTIONS]), node) for node in "ab")
    try:
        await a.push_initial()
        await a.registry.adeploy(specs)
        await a.flush()
        await b.push_initial()
        await b.sync()
        redis_server.client().flushall()
        await a._store("f1", specs[0])
        push_initial = b.push_initial

        async def redis_gone() -> None:
            raise ConnectionError("Redis went away again")

        b.push_initial = redis_gone  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await b.sync()
        b.push_initial = push_initial  # type: ignore[method-assign]
        await b.sync()
        assert "f1" in b.registry and "f2" in b.registry
        assert set(redis_server.client().hkeys(Keys().functions)) == {"f1", "f2"}
    finally:
        for node in (a, b):
            await node.registry.stop_workers()
            await node.redis.aclose()
