"""Fault: Redis (AOF, `appendfsync always`) is down for 3 s while jobs run and wait in the queue.
Every accepted job used to fail 200503 at once, even one no worker had taken yet. Now each
command lost to the outage is retried within the job's deadline: the running jobs go on, the
queued ones run once Redis is back, and none runs twice (the worker's `taken` guard)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.support.cluster import (
    CLUSTER_FUNCTIONS,
    RedisServer,
    require_redis_server,
    serving,
    sse,
    workers_serving,
)

COUNTED = {"name": "counted", "handler": "relay.counted", "codePath": str(CLUSTER_FUNCTIONS), "timeout": 60,
           "concurrency": 2}
JOBS = 6


@pytest.fixture
def aof_redis(tmp_path):
    require_redis_server()
    (tmp_path / "aof").mkdir()
    server = RedisServer(aof=tmp_path / "aof")
    yield server
    server.kill()


async def _final(s, base: str, job_id: str) -> dict:
    while True:
        async with s.get(f"{base}/v2/counted/status/{job_id}") as r:
            body = await r.json()
        if body.get("status") not in ("IN_QUEUE", "IN_PROGRESS"):
            return body
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("workers", [1, 2])
async def test_jobs_survive_a_redis_outage_and_run_exactly_once(aof_redis, start_server, start_worker, tmp_path,
                                                                 workers):
    """With two workers, each may find the other's entries idle and its heartbeat key expired once
    Redis is back (the reclaim waits after an outage; `taken` refuses a live taker's entry)."""
    runs = tmp_path / "runs.log"
    runs.touch()
    async with serving(aof_redis.url, start_server, start_worker, COUNTED) as cluster:
        s, base = cluster.session, cluster.frontend.url
        for _ in range(workers - 1):
            start_worker(aof_redis.url)
        await workers_serving(s, base, "counted", workers)
        ids = []
        for n in range(JOBS):   # two run at once per worker (concurrency 2), the others wait in the Redis queue
            async with s.post(f"{base}/v2/counted/run",
                              json={"input": {"n": n, "log": str(runs), "wait_ms": 1500}}) as r:
                assert r.status == 200, await r.text()
                ids.append((await r.json())["id"])
        # and a streaming call, queued behind them: its client waits through the outage
        call = asyncio.ensure_future(sse(s, base, "counted", {"n": 100, "log": str(runs), "wait_ms": 1500}))
        queued = aof_redis.client()
        deadline = time.monotonic() + 20
        # readiness: two handlers run, and the streaming call is queued (its entry is in the stream)
        while len(runs.read_text().split()) < 2 * workers or not any(
                f.get("mode") == "sse" and "items" not in f   # (a job's entry keeps its items)
                for _, f in queued.xrange("fnstream:{queue:counted}")):
            assert time.monotonic() < deadline, "no job started"
            await asyncio.sleep(0.05)
        aof_redis.kill()       # the running ones write their next output while it is down
        await asyncio.sleep(3)
        aof_redis.start()      # same port, same AOF
        ends = await asyncio.wait_for(asyncio.gather(*(_final(s, base, i) for i in ids)), 60)
        code, events = await asyncio.wait_for(call, 60)
    assert [e["status"] for e in ends] == ["COMPLETED"] * JOBS, ends
    assert [e["output"] for e in ends] == list(range(JOBS)), ends
    assert code == 200 and [d for _, d in events][-2:] == ["100", "[DONE]"], events
    assert [json.loads(d)["i"] for _, d in events[:-2]] == [1, 2, 3], events
    assert sorted(map(int, runs.read_text().split())) == [*range(JOBS), 100]   # each ran exactly once


async def test_an_invocation_queued_twice_runs_once(redis_server, start_server, start_worker, tmp_path):
    """An enqueue sent again through an outage (its reply lost, the entry written) queues the same
    invocation twice: the worker that takes one records it (`taken`), the other entry is dropped."""
    runs = tmp_path / "runs.log"
    runs.touch()
    r = redis_server.client()
    queue = "fnstream:{queue:counted}"
    async with serving(redis_server.url, start_server, start_worker, COUNTED):
        entry = {"id": "twice", "function": "counted", "mode": "sse", "trace": "t", "buffer": 100,
                 "maxWrite": 1000, "maxResponse": 1000, "deadline": repr(time.time() + 30),
                 "event": json.dumps({"n": 1, "log": str(runs)})}
        r.xadd(queue, entry)
        r.xadd(queue, entry)
        deadline = time.monotonic() + 20
        while r.xlen(queue) or r.xpending(queue, "workers")["pending"]:   # both acked and deleted
            assert time.monotonic() < deadline, r.xrange(queue)
            await asyncio.sleep(0.05)
        out = r.xrange("fnstream:{inv:twice}:out")
    assert [f["t"] for _, f in out if f["t"] != "data"] == ["result"], out
    assert runs.read_text().split() == ["1"]
