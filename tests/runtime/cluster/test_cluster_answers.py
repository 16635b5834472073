"""JSON answers through the frontend's answers stream (runtime/cluster/answers.py): one reader
per frontend instead of a pump per invocation; an older worker still answers the old way; a
silent worker times out; Redis lost fails the waiters at once."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from runtime.cluster import answers
from runtime.cluster.queue import WorkQueue
from runtime.cluster.settings import ClusterUnavailableError, Keys, connect
from runtime.errors import FunctionTimeoutError
from runtime.manifest import FunctionSpec
from tests.support.cluster import (
    RELAY,
    PreviousWorkerProcess,
    deploy,
    frontend_args,
    status,
    wait_until,
    workers_serving,
)


async def _invoke_many(s: aiohttp.ClientSession, base: str, n: int) -> list[dict]:
    async def one(i: int) -> dict:
        async with s.post(base + "/serverless/v1/functions/relay/invocations", json={"count": 0, "i": i}) as r:
            assert r.status == 200, await r.text()
            return await r.json()
    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_json_answers_come_on_one_stream_read_for_all(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        [worker] = await workers_serving(s, a.url, "relay")
        assert worker["answers"] == 1                      # the worker says it answers on the stream
        node = (await status(s, a.url))["node"]
        before = r.info("commandstats").get("cmdstat_xread", {}).get("calls", 0)
        got = await _invoke_many(s, a.url, 40)
    assert all(g["count"] == 0 for g in got)
    reads = r.info("commandstats")["cmdstat_xread"]["calls"] - before
    assert reads < 40                                      # not one blocking read per invocation
    key = f"fnstream:{{answers:{node}}}"
    assert r.type(key) == "stream"

    async def trimmed():  # the trim goes out with the loop turn after the answers
        return r.xlen(key) <= 1
    await wait_until(trimmed, "the answers read trimmed", limit=5)
    assert 0 < r.ttl(key) <= 60                            # a dead frontend's stream expires
    assert not list(r.scan_iter("fnstream:{inv:*"))        # no per-invocation keys left behind


async def test_a_worker_of_the_version_before_still_answers(redis_server, start_server):
    a = start_server(*frontend_args(redis_server.url))
    old = PreviousWorkerProcess(redis_server.url)
    try:
        async with aiohttp.ClientSession() as s:
            await deploy(s, a.url, RELAY)
            [worker] = await workers_serving(s, a.url, "relay")
            assert "answers" not in worker
            got = await _invoke_many(s, a.url, 10)    # on the invocations' own streams, as before
        assert [g["count"] for g in got] == [0] * 10
    finally:
        old.stop()


def _spec(timeout: float) -> FunctionSpec:
    return FunctionSpec(name="nobody-runs-it", handler="x.handler", timeout=timeout)


async def test_no_answer_by_the_deadline_times_out_and_tells_the_worker(redis_server, monkeypatch):
    monkeypatch.setattr(answers, "DEADLINE_GRACE", 0.0)
    redis = connect(redis_server.url)
    queue = WorkQueue(redis, Keys(), "frontend-test", ttl=60, heartbeat=1)
    try:
        inv = await queue.submit(_spec(0.2), {}, mode="json", buffer_events=10, max_write_size=1000,
                                 max_response_size=1000, trace_id=None, reply=True)
        entry = redis_server.client().xrange("fnstream:{queue:nobody-runs-it}")[0][1]
        assert entry["reply"] == queue.answers.key
        with pytest.raises(FunctionTimeoutError, match="no answer from the cluster's workers"):
            await asyncio.wait_for(inv.encoded_result(), 5)
        await asyncio.sleep(0.1)   # the cancellation is sent in the background
        assert redis_server.client().get(f"fnstream:{{inv:{inv.id}}}:cancel")
    finally:
        await queue.close()
        await redis.aclose()


async def test_an_answer_after_the_client_left_is_dropped(redis_server):
    redis = connect(redis_server.url)
    queue = WorkQueue(redis, Keys(), "frontend-test", ttl=60, heartbeat=1)
    try:
        inv = await queue.submit(_spec(30), {}, mode="json", buffer_events=10, max_write_size=1000,
                                 max_response_size=1000, trace_id=None, reply=True)
        inv.cancel("client disconnected")
        await redis.xadd(queue.answers.key, {"id": inv.id, "t": "result", "d": "1"})
        late = await queue.submit(_spec(30), {}, mode="json", buffer_events=10, max_write_size=1000,
                                  max_response_size=1000, trace_id=None, reply=True)
        await redis.xadd(queue.answers.key, {"id": late.id, "t": "error", "code": "4003", "status": "500",
                                             "message": "boom", "w": "worker-x"})
        with pytest.raises(Exception, match="boom"):
            await asyncio.wait_for(late.encoded_result(), 5)
        assert late.worker == "worker-x"
        assert inv.answer is not None and inv.answer.cancelled()
    finally:
        await queue.close()
        await redis.aclose()


async def test_redis_lost_fails_the_waiting_invocations_at_once(redis_server):
    redis = connect(redis_server.url)
    queue = WorkQueue(redis, Keys(), "frontend-test", ttl=60, heartbeat=1)
    try:
        inv = await queue.submit(_spec(30), {}, mode="json", buffer_events=10, max_write_size=1000,
                                 max_response_size=1000, trace_id=None, reply=True)
        await asyncio.sleep(0.1)   # the reader is blocked in its XREAD
        redis_server.kill()
        with pytest.raises(ClusterUnavailableError, match="lost the connection to Redis"):
            await asyncio.wait_for(inv.encoded_result(), 5)   # not the function's 30 s timeout
    finally:
        await queue.close()
        await redis.aclose()
