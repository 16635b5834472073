"""The Batcher over a real redis-server: the commands of one loop turn share one round trip, in
order, and a failing command fails only its own caller."""
from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis

from runtime.cluster.batch import Batcher
from runtime.cluster.settings import connect
from tests.support.cluster import frontend_args, workers_serving


def reads(client) -> int:
    """Read events the server has served: one per client round trip."""
    return int(client.info("stats")["total_reads_processed"])


async def test_one_loop_turn_is_one_round_trip_in_order(redis_server):
    sync = redis_server.client()
    r = connect(redis_server.url)
    try:
        batch = Batcher(r)
        await r.ping()                         # the pooled connection exists before counting
        before = reads(sync)
        replies = await asyncio.gather(*(batch.call("RPUSH", "batched", i) for i in range(50)),
                                       batch.call("LRANGE", "batched", 0, -1))
        batched = reads(sync) - before - 1         # less this INFO's own read
        assert replies[:50] == list(range(1, 51))
        assert replies[50] == [str(i) for i in range(50)]          # executed in the order issued
        before = reads(sync)
        for i in range(50):                        # the same, one loop turn each
            await batch.call("RPUSH", "apart", i)
        apart = reads(sync) - before - 1
        assert batched <= 2 and apart >= 50, (batched, apart)   # 1, or 2 with a connection health check
    finally:
        await batch.close()
        await r.aclose()


async def test_a_failing_command_fails_only_its_caller(redis_server):
    r = connect(redis_server.url)
    try:
        batch = Batcher(r)
        await r.set("plain", "x")
        ok, bad, after = await asyncio.gather(batch.call("GET", "plain"), batch.call("LPUSH", "plain", "y"),
                                              batch.call("INCR", "counter"), return_exceptions=True)
        assert ok == "x" and after == 1
        assert isinstance(bad, aioredis.ResponseError) and "WRONGTYPE" in str(bad)
        with pytest.raises(aioredis.ResponseError, match="WRONGTYPE"):   # alone in its loop turn too
            await batch.call("LPUSH", "plain", "y")
        assert await batch.call("GET", "plain") == "x"
    finally:
        await batch.close()
        await r.aclose()


def calls(client, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_merged_commands_are_one_command_sent_last(redis_server):
    """The DELs (XACKs...) of one loop turn are one command, after every other command of the
    turn even when issued first (an ack follows its answer); each caller gets its reply or error."""
    sync = redis_server.client()
    r = connect(redis_server.url)
    try:
        batch = Batcher(r)
        await r.ping()
        before = calls(sync, "del")
        merged = [batch.merge(("DEL",), f"key{i}") for i in range(20)]
        writes = [batch.call("SET", f"key{i}", "x") for i in range(20)]
        assert await asyncio.gather(*merged) == [20] * 20    # all twenty written first, then deleted
        assert await asyncio.gather(*writes) == [True] * 20
        assert calls(sync, "del") - before == 1
        assert await r.exists(*(f"key{i}" for i in range(20))) == 0
        await r.set("plain", "x")
        bad = [batch.merge(("XACK", "plain", "g"), f"{i}-0") for i in range(3)]
        other = batch.merge(("XDEL", "plain"), "1-0")
        results = await asyncio.gather(*bad, other, return_exceptions=True)
        assert all(isinstance(x, aioredis.ResponseError) and "WRONGTYPE" in str(x) for x in results), results
        assert await r.get("plain") == "x"
    finally:
        await batch.close()
        await r.aclose()


async def test_lost_connection_fails_every_caller_of_the_batch(redis_server):
    r = connect(redis_server.url)
    try:
        batch = Batcher(r)
        await r.ping()
        redis_server.kill()
        results = await asyncio.gather(batch.call("GET", "a"), batch.call("GET", "b"), return_exceptions=True)
        assert all(isinstance(x, (aioredis.ConnectionError, OSError)) for x in results), results
    finally:
        await batch.close()
        await r.aclose()


@pytest.mark.parametrize(("accept", "kept", "limit"), [("application/json", True, 7.5),
                                                       ("text/event-stream", False, 7.5),
                                                       ("text/event-stream", True, 14.5)])
async def test_a_queued_invocation_costs_few_round_trips(redis_server, start_server, start_worker, accept, kept,
                                                         limit):
    """One at a time (nothing to share a pipeline with): frontend XADD, XREAD of the answer, DEL;
    worker XREADGROUP, EXISTS, EVAL + XACK + XDEL — 6 round trips, where there were 10 (a start
    entry read on its own, an ack SET, the answer and the acks sent apart). The background loops'
    round trips (heartbeats, worker watch, registry sync), measured while idle, are subtracted.
    Keeping an SSE invocation's output for a resume from another frontend (runtime/durable.py)
    costs its own: the stream's first publish, its result and end, its expiry."""
    retention = [] if kept else ["-s", "streams.invocationRetentionSeconds=0"]
    a = start_server(*frontend_args(redis_server.url), *retention)
    start_worker(redis_server.url)
    sync = redis_server.client()
    url = a.url + "/serverless/v1/functions/echo/invocations"
    async with aiohttp.ClientSession() as s:
        await workers_serving(s, a.url, "echo")
        async with s.post(url, json={}, headers={"Accept": accept}) as resp:   # connections warm
            assert resp.status == 200, await resp.text()
        idle0, t0 = reads(sync), time.monotonic()
        await asyncio.sleep(1.0)
        background = (reads(sync) - idle0 - 1) / (time.monotonic() - t0)
        n = 50
        before, t0 = reads(sync), time.monotonic()
        for i in range(n):
            async with s.post(url, json={"n": i}, headers={"Accept": accept}) as resp:
                assert resp.status == 200 and str(i) in await resp.text()
        await asyncio.sleep(0.1)    # the worker's ack and the frontend's DEL follow the answer
        trips = (reads(sync) - before - 1 - background * (time.monotonic() - t0)) / n
    assert trips <= limit, f"{trips:.1f} round trips per invocation ({background:.0f}/s in the background)"


async def test_a_user_and_a_database_of_the_url_are_used(redis_server):
    """The Batcher's own connection (lean.py) logs in as the URL's user and selects its database."""
    admin = redis_server.client()
    admin.acl_setuser("lean", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    r = connect(f"redis://lean:pw@127.0.0.1:{redis_server.port}/3")
    try:
        batch = Batcher(r)
        assert await batch.call("SET", "where", "db3") is True
        assert await batch.call("ACL", "WHOAMI") == "lean"
        assert admin.get("where") is None
        third = redis.Redis(port=redis_server.port, db=3, decode_responses=True)
        assert third.get("where") == "db3"
        third.close()
        await batch.close()
        wrong = connect(f"redis://lean:nope@127.0.0.1:{redis_server.port}/0")
        refused = Batcher(wrong)
        with pytest.raises(aioredis.AuthenticationError):
            await refused.call("GET", "where")
        await refused.close()
        await wrong.aclose()
    finally:
        await r.aclose()


async def test_a_restarted_redis_is_reconnected_to(redis_server):
    """A connection Redis dropped is not reused: the next loop turn's commands go out on a new one."""
    r = connect(redis_server.url)
    try:
        batch = Batcher(r)
        assert await batch.call("SET", "k", "1") is True
        redis_server.kill()
        redis_server.start()
        assert await batch.call("SET", "k", "2") is True
        assert await batch.call("GET", "k") == "2"
    finally:
        await batch.close()
        await r.aclose()


async def test_a_reply_that_does_not_come_fails_at_the_socket_timeout(redis_server):
    """A Redis that stops answering (SIGSTOP) fails the batch with TimeoutError, as redis-py would,
    instead of leaving its callers waiting; once it answers again, so does the Batcher."""
    r = aioredis.Redis.from_url(redis_server.url, decode_responses=True, socket_timeout=0.3)
    batch = Batcher(r)
    try:
        assert await batch.call("SET", "k", "1") is True
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(aioredis.TimeoutError):
                await batch.call("GET", "k")
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        assert await batch.call("GET", "k") == "1"
    finally:
        await batch.close()
        await r.aclose()
