"""JSON answers through the frontend's answers stream (runtime/cluster/answers.py): one reader
per frontend instead of a pump per invocation; an older worker still answers the old way; a
silent worker times out; Redis lost is waited out until the waiters' deadlines."""
from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable

import aiohttp
import pytest

from runtime.cluster import answers
from runtime.cluster.queue import WorkQueue
from runtime.cluster.settings import ClusterUnavailableError, Keys, connect
from runtime.errors import FunctionServiceError, FunctionTimeoutError
from runtime.manifest import FunctionSpec
from tests.support.cluster import (
    RELAY,
    PreviousWorkerNodeProcess,
    WorkerNodeProcess,
    deploy,
    frontend_args,
    only_worker,
    serving,
    status,
    wait_until,
    workers_serving,
)


async def _invoke(s: aiohttp.ClientSession, base: str, event: dict, name: str = "relay") -> dict:
    """One JSON call of `name` that must succeed; its result."""
    async with s.post(f"{base}/serverless/v1/functions/{name}/invocations", json=event) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _invoke_many(s: aiohttp.ClientSession, base: str, n: int) -> list[dict]:
    return await asyncio.gather(*(_invoke(s, base, {"count": 0, "i": i}) for i in range(n)))


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
    old = PreviousWorkerNodeProcess(redis_server.url)
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


@pytest.fixture
async def work_queue(redis_server):
    """Factory: a frontend's work queue in this process on the test's Redis (a URL of its own may
    name a user); each is closed after the test."""
    made: list[WorkQueue] = []

    def make(url: str | None = None) -> WorkQueue:
        made.append(WorkQueue(connect(url or redis_server.url), Keys(), "frontend-test", ttl=60, heartbeat=1))
        return made[-1]
    yield make
    for queue in made:
        await queue.close()
        await queue.redis.aclose()
    # A client whose server was killed under it (redis-py drops such a connection without closing
    # its socket): collected here, not as a ResourceWarning in whichever test the GC runs next.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


async def _queued(queue: WorkQueue, timeout: float = 30):
    return await queue.submit(_spec(timeout), {}, mode="json", buffer_events=10, max_write_size=1000,
                              max_response_size=1000, trace_id=None, reply=True)


async def test_no_answer_by_the_deadline_times_out_and_tells_the_worker(redis_server, work_queue, monkeypatch):
    monkeypatch.setattr(answers, "DEADLINE_GRACE", 0.0)
    queue = work_queue()
    inv = await _queued(queue, timeout=0.2)
    entry = redis_server.client().xrange("fnstream:{queue:nobody-runs-it}")[0][1]
    assert entry["reply"] == queue.answers.key
    with pytest.raises(FunctionTimeoutError, match="no answer from the cluster's workers"):
        await asyncio.wait_for(inv.encoded_result(), 5)
    await asyncio.sleep(0.1)   # the cancellation is sent in the background
    assert redis_server.client().get(f"fnstream:{{inv:{inv.id}}}:cancel")


async def test_an_answer_after_the_client_left_is_dropped(work_queue):
    queue = work_queue()
    inv = await _queued(queue)
    inv.cancel("client disconnected")
    await queue.redis.xadd(queue.answers.key, {"id": inv.id, "t": "result", "d": "1"})
    late = await _queued(queue)
    await queue.redis.xadd(queue.answers.key, {"id": late.id, "t": "error", "code": "4003", "status": "500",
                                               "message": "boom", "w": "worker-x"})
    with pytest.raises(FunctionServiceError, match="boom"):
        await asyncio.wait_for(late.encoded_result(), 5)
    assert late.worker == "worker-x"
    assert inv.answer is not None and inv.answer.cancelled()


async def test_a_cancel_marker_lasts_as_long_as_its_queued_call_may_still_be_taken(redis_server, work_queue):
    """A call whose client left while it waited in its queue: a worker that takes it later must
    still find the cancel marker. It lived the keys' TTL (60 s) only, so a call queued longer than
    that (functions may run 900 s) ran after all."""
    queue = work_queue()
    inv = await _queued(queue, timeout=600)
    inv.cancel("client disconnected")
    key = f"fnstream:{{inv:{inv.id}}}:cancel"

    async def marked():
        return redis_server.client().exists(key)
    await wait_until(marked, "the cancel marker")
    assert 600 <= redis_server.client().ttl(key) <= 600 + 10   # to the deadline, not the keys' 60 s


async def test_redis_lost_is_waited_out_by_the_waiting_invocations(redis_server, work_queue):
    """A Redis restart of a few seconds: the waiting call gets the answer a worker writes once Redis
    is back (it failed 503 at once, though the worker was to answer within the deadline)."""
    queue = work_queue()
    inv = await _queued(queue)
    await asyncio.sleep(0.1)   # the reader is blocked in its XREAD
    redis_server.kill()
    await asyncio.sleep(1.5)
    assert inv.answer is not None and not inv.answer.done()
    redis_server.start()
    redis_server.client().xadd(queue.answers.key, {"id": inv.id, "t": "result", "d": "7"})
    assert await asyncio.wait_for(inv.encoded_result(), 10) == "7"


async def test_redis_lost_past_the_deadline_fails_the_waiting_invocation(redis_server, work_queue, monkeypatch):
    monkeypatch.setattr(answers, "DEADLINE_GRACE", 0.0)
    inv = await _queued(work_queue(), timeout=1)
    await asyncio.sleep(0.1)
    redis_server.kill()
    with pytest.raises(ClusterUnavailableError, match="lost the connection to Redis"):
        await asyncio.wait_for(inv.encoded_result(), 5)   # at its deadline, not before


async def test_a_json_client_that_leaves_stops_the_handler_on_the_worker(redis_server, start_server, start_worker):
    async with serving(redis_server.url, start_server, start_worker) as cluster:
        s, a = cluster.session, cluster.frontend
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(a.url + "/serverless/v1/functions/relay/invocations", json={"wait_ms": 20_000},
                              timeout=aiohttp.ClientTimeout(total=1)):
                pass

        async def stopped():
            w = await only_worker(s, a.url)
            return w is not None and w["running"] == 0 and w["completed"] == 1
        await wait_until(stopped, "the worker to stop the abandoned JSON call", limit=10)   # not after 20 s
        assert [g["count"] for g in await _invoke_many(s, a.url, 3)] == [0] * 3   # and it serves on


async def test_a_worker_takes_no_more_of_a_queue_than_the_function_can_run(redis_server, start_server,
                                                                          start_worker):
    """`concurrency` is per instance: a worker at it leaves the rest queued for other workers
    (it used to take every waiting entry and run them one after another)."""
    a = start_server(*frontend_args(redis_server.url))
    first = start_worker(redis_server.url)
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, {**RELAY, "concurrency": 1})
        await workers_serving(s, a.url, "relay")

        calls = [asyncio.ensure_future(_invoke(s, a.url, {"wait_ms": 1500, "count": 0})) for _ in range(4)]

        async def running():
            w = await only_worker(s, a.url)
            return w is not None and w["running"] == 1
        await wait_until(running, "the first call to run")
        await asyncio.sleep(0.3)   # (a worker that takes more takes it at once)
        assert r.xpending("fnstream:{queue:relay}", "workers")["pending"] == 1   # three wait in the queue
        second = start_worker(redis_server.url)
        pids = [got["pid"] for got in await asyncio.gather(*calls)]
    assert first.pid in pids and second.pid in pids   # the second worker took what the first could not run


async def test_a_read_across_queues_that_takes_more_than_its_slots_leaves_no_extra_slots(
        redis_server, start_server, start_worker):
    """XREADGROUP's COUNT is per queue: one read of two queues may take two entries for one free
    slot. They run, and the worker's slots come back to `workerConcurrency`, not above it."""
    a = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url, "-s", "cluster.workerConcurrency=1")
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        await deploy(s, a.url, {**RELAY, "name": "relay2"})
        await workers_serving(s, a.url, "relay2")

        def call(name: str, wait_ms: int) -> Awaitable[dict]:
            return _invoke(s, a.url, {"wait_ms": wait_ms, "count": 0}, name)
        async def running():
            w = await only_worker(s, a.url)
            return w is not None and w["running"] >= 1
        for _ in range(3):   # while the one slot is busy, an entry comes on each queue: one read takes both
            busy = asyncio.ensure_future(call("relay", 600))
            await wait_until(running, "a call to run")
            await asyncio.gather(busy, call("relay", 100), call("relay2", 100))
        calls = [asyncio.ensure_future(call("relay", 1500)) for _ in range(3)]
        await wait_until(running, "a call to run")
        await asyncio.sleep(0.3)
        assert r.xpending("fnstream:{queue:relay}", "workers")["pending"] == 1   # one slot: one held
        await asyncio.gather(*calls)


async def test_what_redis_refuses_fails_the_waiting_calls_and_the_reader_goes_on(redis_server, work_queue):
    """An ACL that does not grant the answers stream: every call fails at once with the reason."""
    admin = redis_server.client()
    admin.acl_setuser("queue-only", enabled=True, passwords=["+pw"], keys=["fnstream:{queue:*"],
                      commands=["+@all"])
    queue = work_queue(f"redis://queue-only:pw@127.0.0.1:{redis_server.port}/0")
    for _ in range(2):   # the reader goes on after a refusal
        inv = await _queued(queue)
        with pytest.raises(ClusterUnavailableError, match="refused to read this node's answers stream"):
            await asyncio.wait_for(inv.encoded_result(), 5)


async def test_a_malformed_error_answer_fails_its_call_as_a_500(work_queue):
    queue = work_queue()
    inv = await _queued(queue)
    await queue.redis.xadd(queue.answers.key, {"id": inv.id, "t": "error", "code": "E1", "message": "odd"})
    with pytest.raises(FunctionServiceError, match="odd") as caught:
        await asyncio.wait_for(inv.encoded_result(), 5)
    assert (caught.value.code, caught.value.status) == (200500, 500)
    ok = await _queued(queue)   # and the next answer still arrives
    await queue.redis.xadd(queue.answers.key, {"id": ok.id, "t": "result", "d": "[1]"})
    assert await asyncio.wait_for(ok.encoded_result(), 5) == "[1]"


async def test_an_answer_a_previous_worker_wrote_to_the_calls_own_stream_is_found(work_queue):
    """A worker of the version before that joins (or reclaims the entry) after the node chose the
    answers stream writes the answer to the invocation's own stream: it is looked for there too."""
    queue = work_queue()
    inv = await _queued(queue)
    out = f"fnstream:{{inv:{inv.id}}}:out"
    await queue.redis.xadd(out, {"t": "result", "d": '{"ok":true}', "w": "worker-old"})
    assert await asyncio.wait_for(inv.encoded_result(), 10) == '{"ok":true}'
    assert inv.worker == "worker-old"
    await asyncio.sleep(0.1)
    assert not await queue.redis.exists(out)   # and its stream is dropped


async def test_a_queue_read_on_its_own_after_its_function_was_full_goes_back_when_idle(
        redis_server, start_server, start_worker):
    """A queue left out while its function was at its concurrency gets a read of its own once it has
    room; idle, it hands it back, so idle functions cost no read (and connection) each."""
    a = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, {**RELAY, "concurrency": 1})
        await workers_serving(s, a.url, "relay")

        def call() -> Awaitable[dict]:
            return _invoke(s, a.url, {"wait_ms": 300, "count": 0})
        await asyncio.gather(*(call() for _ in range(3)))   # the 2nd and 3rd wait for room

        def reads() -> int:
            return r.info("commandstats").get("cmdstat_xreadgroup", {}).get("calls", 0)

        async def back_to_idle():   # the slot's blocking read alone: about one a second
            before = reads()
            await asyncio.sleep(3)
            return reads() - before <= 4
        await wait_until(back_to_idle, "the queue's own read to end", limit=25)
        await asyncio.gather(*(call() for _ in range(2)))   # and it is read as before


async def test_a_worker_that_redis_refuses_a_consumer_group_serves_once_it_may(redis_server, start_server):
    """A refused XGROUP CREATE (an ACL, READONLY in a failover) does not end the worker's queue
    supervision: once Redis allows it, the worker serves."""
    r = redis_server.client()
    r.acl_setuser("w", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                  commands=["+@all", "-xgroup|create"])
    a = start_server(*frontend_args(redis_server.url))
    worker = WorkerNodeProcess(f"redis://w:pw@127.0.0.1:{redis_server.port}/0")
    try:
        async with aiohttp.ClientSession() as s:
            await deploy(s, a.url, {**RELAY, "timeout": 1})
            await workers_serving(s, a.url, "relay")
            await asyncio.sleep(1)   # its supervision has been refused by now
            r.acl_setuser("w", enabled=True, commands=["+xgroup|create"])

            async def served():
                async with s.post(a.url + "/serverless/v1/functions/relay/invocations", json={"count": 0}) as resp:
                    return resp.status == 200
            await wait_until(served, "the worker to serve once allowed", limit=30)
    finally:
        worker.stop()


async def test_a_reclaim_never_reruns_an_entry_this_worker_just_finished(redis_server):
    """A JSON call's entry this worker finished (answered, its XACK on its way) may still come back
    from an XAUTOCLAIM Redis ran just before that XACK. It is not run again — its answer is in the
    frontend's stream, where the re-run check does not look — nor is its `taken` guard set again
    after the frontend deleted it (what left `{inv:*}:taken` keys behind, a run in four under load)."""
    import json
    import time

    from runtime.cluster.wire import encode_call
    from runtime.cluster.worker import QueueConsumer
    from runtime.executor import Executor
    from runtime.registry import Registry

    keys, r = Keys(), redis_server.client()
    key = keys.queue("default/relay")
    r.xgroup_create(key, Keys.GROUP, id="0", mkstream=True)
    redis = connect(redis_server.url)
    consumer = QueueConsumer(redis, keys, Registry(), Executor(), "w1", claim_idle=0.01)

    def queued_and_read(inv_id: str) -> list:
        """An entry read by w1, then what an XAUTOCLAIM (of w1's own idle entries) returns of it."""
        fields = encode_call(inv_id, key, json.dumps({}), mode="json", trace="t" * 32, deadline=time.time() + 30,
                             buffer=16, max_write=1024, max_response=1024, buffer_bytes=None, items=False,
                             reply="fnstream:{answers:n}")
        r.xadd(key, dict(zip(fields[::2], fields[1::2], strict=True)))
        r.xreadgroup(Keys.GROUP, "w1", {key: ">"})
        return r.xautoclaim(key, Keys.GROUP, "w1", 0, "0-0")[1]

    try:
        stale = queued_and_read("a" * 22)
        [(entry_id, _)] = stale
        r.xack(key, Keys.GROUP, entry_id)  # the worker's own XACK of it, which Redis ran after that claim
        r.xdel(key, entry_id)
        assert await consumer._take(key, stale, reclaimed=True) == 0
        assert not r.exists(keys.taken("a" * 22))

        finishing = queued_and_read("b" * 22)  # still pending: its answer and ack are on their way
        consumer._finishing.add("b" * 22)
        assert await consumer._take(key, finishing, reclaimed=True) == 0
        assert not r.exists(keys.taken("b" * 22))
        assert not consumer._jobs
    finally:
        await redis.aclose()
