"""Cluster mode over a real redis-server: frontends and workers as separate processes."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest

from frontend.client import iter_sse
from tests.support.cluster import (
    CLUSTER_FUNCTIONS,
    RELAY,
    deploy,
    frontend_args,
    only_worker,
    serving,
    sse,
    status,
    wait_until,
    workers_serving,
)
from tests.support.servers import FUNCTIONS, assert_live


async def test_invoke_on_frontend_runs_on_worker_and_streams_as_produced(redis_server, start_server, start_worker):
    async with serving(redis_server.url, start_server, start_worker) as cluster:
        s, a, worker = cluster.session, cluster.frontend, cluster.worker
        status_code, got = await sse(s, a.url, "relay", {"count": 5, "delay_ms": 300})
    assert status_code == 200
    data = [d for _, d in got]
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:5]]
    assert [e["i"] for e in events] == [1, 2, 3, 4, 5]
    assert {e["pid"] for e in events} == {worker.pid}          # produced by the worker process
    assert json.loads(data[5]) == {"count": 5, "pid": worker.pid}
    assert_live([t for t, _ in got[:5]], 1.2)                 # the events came while it ran


async def test_json_invocation_and_generator_result_through_worker(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, {**RELAY, "name": "gen", "handler": "relay.gen"})
        await workers_serving(s, a.url, "gen")
        async with s.post(a.url + "/serverless/v1/functions/gen/invocations", json={"count": 4}) as r:
            assert r.status == 200
            assert await r.json() == [0, 1, 2, 3]
            assert r.headers["X-Inner-Code"] == "0"
        async with s.post(a.url + "/serverless/v1/functions/ticker/invocations", data=b"{not json") as r:
            assert r.status == 400                              # bad input is refused before queuing


async def test_deploy_on_a_invoke_on_b_within_a_second(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url, role="all"))
    b = start_server(*frontend_args(redis_server.url, role="all"))
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        deployed = time.monotonic()

        async def on_b():
            async with s.post(b.url + "/serverless/v1/functions/relay/invocations", json={"count": 1}) as r:
                return r.status == 200 and await r.json()
        result = await wait_until(on_b, "relay on B", limit=1.0)
        assert result["count"] == 1 and time.monotonic() - deployed < 1.0
        # a redeploy on B reaches A; a delete on A reaches B
        await deploy(s, b.url, {**RELAY, "description": "v2"}, method="PUT")

        async def described_on_a():
            async with s.get(a.url + "/admin/v1/functions/relay") as r:
                return (await r.json())["function"]["description"] == "v2"
        await wait_until(described_on_a, "redeploy on A", limit=1.0)
        async with s.delete(a.url + "/admin/v1/functions/relay") as r:
            assert r.status == 200

        async def gone_on_b():
            async with s.get(b.url + "/admin/v1/functions/relay") as r:
                return r.status == 404
        await wait_until(gone_on_b, "delete on B", limit=1.0)


async def test_node_without_the_code_reports_it_unavailable(redis_server, start_server, tmp_path):
    code = tmp_path / "only_here"
    code.mkdir()
    (code / "mine.py").write_text("def handler(event, context):\n    return 'here'\n")
    a = start_server(*frontend_args(redis_server.url, role="all"), "-s",
                     f"runtime.codeRoots=[{FUNCTIONS},{CLUSTER_FUNCTIONS},{tmp_path}]")
    b = start_server(*frontend_args(redis_server.url, role="frontend"))
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, {"name": "mine", "handler": "mine.handler", "codePath": str(code)})

        async def unavailable_on_b():
            return (await status(s, b.url))["unavailable"].get("mine")
        reason = await wait_until(unavailable_on_b, "mine unavailable on B")
        assert "codeRoots" in reason or "code" in reason
        # B cannot run it but A's node (role all) is a worker that can: B queues it there.
        await workers_serving(s, b.url, "mine")
        async with s.post(b.url + "/serverless/v1/functions/mine/invocations", json={}) as r:
            assert r.status == 200, await r.text()
            assert await r.json() == "here"


GATED_MODULE = """\
import os, pathlib, time
_gate = os.environ.get("GATED_IMPORT_DIR")
if _gate:  # only on the node started with the gate: hold the import until the test releases it
    pathlib.Path(_gate, "importing").touch()
    for _ in range(600):
        if pathlib.Path(_gate, "release").exists():
            break
        time.sleep(0.05)


def handler(event, context):
    return "imported"
"""


async def test_process_function_from_another_node_imports_off_the_event_loop(redis_server, start_server, tmp_path):
    """B applies A's deploy of a process function while its worker is still importing: B keeps serving."""
    code, gate = tmp_path / "code", tmp_path / "gate"
    code.mkdir()
    gate.mkdir()
    (code / "gated.py").write_text(GATED_MODULE)
    roots = ["-s", f"runtime.codeRoots=[{FUNCTIONS},{CLUSTER_FUNCTIONS},{code}]"]
    a = start_server(*frontend_args(redis_server.url, role="all"), *roots)
    b = start_server(*frontend_args(redis_server.url, role="all"), *roots, env={"GATED_IMPORT_DIR": str(gate)})
    loop = asyncio.get_running_loop()
    # Whatever happens, the import is released in the end (so a blocked B fails the test, not hangs it).
    fallback = loop.call_later(8.0, (gate / "release").touch)
    try:
        async with aiohttp.ClientSession() as s:
            await deploy(s, a.url, {"name": "gated", "handler": "gated.handler", "codePath": str(code),
                                    "executor": "process", "timeout": 30})

            async def importing_on_b():
                return (gate / "importing").exists()
            await wait_until(importing_on_b, "B's worker importing gated")
            async with s.get(b.url + "/healthz") as r:
                assert r.status == 200
            assert not (gate / "release").exists(), "B answered only once the import was over"
            (gate / "release").touch()

            async def on_b():
                async with s.post(b.url + "/serverless/v1/functions/gated/invocations", json={}) as r:
                    return r.status == 200 and await r.json()
            assert await wait_until(on_b, "gated on B") == "imported"
    finally:
        fallback.cancel()


def pid_of(worker_id: str) -> int:
    return int(worker_id.split("-")[-2])


async def test_worker_killed_before_output_is_rerun_by_another(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    w1, w2 = start_worker(redis_server.url), start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        await workers_serving(s, a.url, "relay", count=2)
        call = asyncio.create_task(sse(s, a.url, "relay", {"wait_ms": 1500, "count": 3, "delay_ms": 50}))

        async def busy_worker():
            return [w for w in (await status(s, a.url))["workers"] if w["running"]]
        taken = (await wait_until(busy_worker, "a worker to take the invocation"))[0]
        victim = pid_of(taken["id"])
        os.kill(victim, signal.SIGKILL)
        status_code, got = await call
    survivor = ({w1.pid, w2.pid} - {victim}).pop()
    data = [d for _, d in got]
    assert status_code == 200 and data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert [e["i"] for e in events[:3]] == [1, 2, 3]
    assert {e["pid"] for e in events} == {survivor}
    assert events[3] == {"count": 3, "pid": survivor}


async def test_worker_killed_mid_stream_gives_error_event_then_done(redis_server, start_server, start_worker):
    async with serving(redis_server.url, start_server, start_worker) as cluster:
        s, a = cluster.session, cluster.frontend
        killed = []

        def on_event(data: str) -> None:
            if not killed and data.startswith("{") and json.loads(data).get("i") == 2:
                os.kill(json.loads(data)["pid"], signal.SIGKILL)
                killed.append(True)
        status_code, got = await sse(s, a.url, "relay", {"count": 100, "delay_ms": 100}, on_event)
    data = [d for _, d in got]
    assert status_code == 200 and killed
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])
    assert error["code"] == 4002 and "lost" in error["message"]
    ticks = [json.loads(d)["i"] for d in data[:-2]]
    assert ticks == list(range(1, len(ticks) + 1)) and len(ticks) < 100   # nothing replayed twice


async def test_client_gone_cancels_on_the_worker_and_drops_keys(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        await workers_serving(s, a.url, "relay")
        async with s.post(a.url + "/serverless/v1/functions/relay/invocations", json={"count": 1000, "delay_ms": 20},
                          headers={"Accept": "text/event-stream"}) as resp:
            async for ev in iter_sse(resp):
                if json.loads(ev["data"])["i"] == 3:
                    break          # leave mid-stream

        async def stopped():
            w = await only_worker(s, a.url)
            return w is not None and w["running"] == 0 and w["completed"] == 1
        await wait_until(stopped, "the worker to stop the abandoned invocation")

        async def no_invocation_keys():
            return not [k for k in r.keys("*") if "{inv:" in k and not k.endswith(":cancel")]
        await wait_until(no_invocation_keys, "per-invocation keys to go")
        assert all(r.ttl(k) > 0 for k in r.keys("*{inv:*"))   # only the expiring cancel marker may remain


async def test_redis_down_gives_503_then_recovers(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    b = start_server(*frontend_args(redis_server.url, role="all"))
    start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        await workers_serving(s, a.url, "relay")
        redis_server.kill()
        async with s.post(a.url + "/serverless/v1/functions/relay/invocations", json={"count": 1}) as r:
            body = await r.json()
            assert r.status == 503 and body["code"] == 200503 and "Redis" in body["message"], body
        async with s.post(a.url + "/admin/v1/functions", json={**RELAY, "name": "relay2"}) as r:
            body = await r.json()
            assert r.status == 503 and "unreachable" in body["message"], body
        async with s.get(a.url + "/healthz") as r:
            assert r.status == 200
        # a node that can run the function itself keeps serving it
        async with s.post(b.url + "/serverless/v1/functions/ticker/invocations", json={"count": 2, "delay_ms": 1}) as r:
            assert r.status == 200 and await r.json() == {"ticks": 2}

        redis_server.start()            # empty again: the nodes re-publish their functions

        async def works_again():
            async with s.post(a.url + "/serverless/v1/functions/relay/invocations", json={"count": 2}) as r:
                return r.status == 200 and await r.json()
        result = await wait_until(works_again, "recovery after Redis restarted")
        assert result["count"] == 2


async def test_no_per_invocation_keys_after_1000_invocations(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await workers_serving(s, a.url, "echo")
        url = a.url + "/serverless/v1/functions/echo/invocations"
        sem = asyncio.Semaphore(32)

        async def one(i: int):
            async with sem:
                accept = "text/event-stream" if i % 2 else "application/json"
                async with s.post(url, json={"i": i}, headers={"Accept": accept}) as resp:
                    assert resp.status == 200
                    return await resp.text()
        bodies = await asyncio.gather(*(one(i) for i in range(1000)))
        assert all(str(i) in body for i, body in enumerate(bodies))

        async def clean():
            return not [k for k in r.keys("*") if "{inv:" in k]
        await wait_until(clean, "per-invocation keys to be deleted")

        # The worker acks and deletes an entry once it has written the answer, so the client may
        # have the answer a moment before: wait for it (a leaked entry still fails after 15 s).
        async def drained():
            return r.xlen("fnstream:{queue:echo}") == 0
        await wait_until(drained, "the work queue to be empty")
        assert r.xpending("fnstream:{queue:echo}", "workers")["pending"] == 0   # and every entry acked


async def test_in_process_node_queues_what_exceeds_its_capacity(redis_server, make_client):
    """A `role: all` node runs what fits locally and queues the rest; its own worker takes it when a slot frees."""
    from tests.support.servers import make_config
    cfg = make_config(**{"cluster.redisUrl": redis_server.url, "cluster.workerHeartbeatSeconds": 0.2,
                         "runtime.codeRoots": [str(FUNCTIONS), str(CLUSTER_FUNCTIONS)]})
    client = await make_client(cfg)
    r = await client.post("/admin/v1/functions", json={**RELAY, "concurrency": 1})
    assert r.status == 201, await r.text()

    async def serving():
        return "relay" in [f for w in (await (await client.get("/cluster/v1/status")).json())["workers"]
                           for f in w["functions"]]
    await wait_until(serving, "the node's worker to serve relay")

    async def call():
        resp = await client.post("/serverless/v1/functions/relay/invocations", json={"count": 3, "delay_ms": 100},
                                 headers={"Accept": "text/event-stream"})
        assert resp.status == 200
        return [ev["data"] async for ev in iter_sse(resp)]
    first, second = await asyncio.gather(call(), call())
    for events in (first, second):
        assert [json.loads(d)["i"] for d in events[:3]] == [1, 2, 3] and events[-1] == "[DONE]"
    groups = redis_server.client().xinfo_groups("fnstream:{queue:relay}")
    assert groups[0]["entries-read"] == 1        # exactly one of the two went through the queue


def test_cluster_config_is_checked():
    from runtime.config import load_config
    from runtime.errors import ConfigError
    cfg = load_config(data={})
    assert cfg.cluster.redisUrl is None and cfg.cluster.role == "all"   # default: no Redis at all
    with pytest.raises(ConfigError, match=r"cluster\.role"):
        load_config(data={"cluster": {"role": "boss"}})


async def test_timeout_on_the_worker_reaches_the_client(redis_server, start_server, start_worker):
    async with serving(redis_server.url, start_server, start_worker, {**RELAY, "timeout": 0.5}) as cluster:
        s, a = cluster.session, cluster.frontend
        async with s.post(a.url + "/serverless/v1/functions/relay/invocations", json={"wait_ms": 3000}) as r:
            body = await r.json()
            assert r.status == 504 and body["code"] == 4010 and "timed out" in body["message"], body
        status_code, got = await sse(s, a.url, "relay", {"count": 50, "delay_ms": 100})
    data = [d for _, d in got]
    assert status_code == 200 and data[-1] == "[DONE]"
    assert json.loads(data[-2])["code"] == 4010 and json.loads(data[0])["i"] == 1   # events, then the timeout


async def test_entry_cancelled_before_a_worker_took_it_is_acked_and_frees_its_slot(redis_server, start_server,
                                                                                    start_worker):
    """An entry whose client left while it was queued is dropped, and its worker slot is given back."""
    a = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url, "-s", "cluster.workerConcurrency=1")
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)
        await workers_serving(s, a.url, "relay")
        r.set("fnstream:{inv:gone}:cancel", "client left", ex=60)   # what WorkQueue.cancel leaves
        r.xadd("fnstream:{queue:relay}", {"id": "gone", "function": "relay", "event": "{}"})

        async def dropped():
            return r.xlen("fnstream:{queue:relay}") == 0
        await wait_until(dropped, "the cancelled entry to be acked and deleted")
        assert r.xpending("fnstream:{queue:relay}", "workers")["pending"] == 0
        async with s.post(a.url + "/serverless/v1/functions/relay/invocations", json={"count": 1}) as resp:
            assert resp.status == 200 and (await resp.json())["count"] == 1   # the only slot is free again


async def _queued_many(redis_server, make_client, count: int, **overrides):
    """An in-process node serving `hostile_fns.many_writes` (concurrency 1) and two SSE invocations of
    `count` writes of 200 kB: the first runs locally, the second is queued for the node's worker and
    starts once the first was read (done here). `count` must be more than the socket buffers hold
    (100 = 20 MB; 30 = 6 MB once fitted, the first call ended early and the second ran locally).
    Returns (client, the queued RemoteInvocation's channel high-water mark [events], the queued one,
    its response)."""
    from frontend.cluster import CLUSTER
    from tests.support.servers import HANDLERS, fn, make_config
    cfg = make_config(**{"cluster.redisUrl": redis_server.url, "cluster.workerHeartbeatSeconds": 0.2,
                         "runtime.codeRoots": [str(FUNCTIONS), str(HANDLERS)],
                         "frontend.args.streamBufferBytes": 500_000, **overrides})
    client = await make_client(cfg)
    r = await client.post("/admin/v1/functions", json=fn("many", "hostile_fns.many_writes", timeout=60,
                                                           concurrency=1))
    assert r.status == 201, await r.text()

    async def serving():
        return "many" in [f for w in (await (await client.get("/cluster/v1/status")).json())["workers"]
                          for f in w["functions"]]
    await wait_until(serving, "the node's worker to serve many")
    queue = client.app[CLUSTER].queue
    queued, high = [], [0]
    original = queue.submit

    async def spy(*args, **kwargs):
        inv = await original(*args, **kwargs)   # its pump has not run yet: watch every put
        queued.append(inv)
        put = inv.channel.put

        async def watched(item):
            await put(item)
            high[0] = max(high[0], len(inv.channel))
        inv.channel.put = watched  # type: ignore[method-assign]
        return inv
    queue.submit = spy  # type: ignore[method-assign]
    event, sse = {"count": count, "size": 200_000}, {"Accept": "text/event-stream"}
    url = "/serverless/v1/functions/many/invocations"
    local = await client.post(url, json=event, headers=sse)      # takes the one local slot
    remote = await client.post(url, json=event, headers=sse)     # queued for the node's worker
    assert len(queued) == 1
    events = [e["data"] async for e in iter_sse(local)]          # frees the slot: the worker starts it
    assert [e[:4] for e in events[:-1]] == [f"{i:04d}" for i in range(count)] and events[-1] == "[DONE]"
    return client, high, queued[0], remote


async def test_a_queued_invocations_output_is_bounded_in_stream_buffer_bytes(redis_server, make_client):
    """frontend.args.streamBufferBytes bounds a RemoteInvocation's channel as it bounds a local one's
    (runtime/channel.py): the relay holds at most 2 writes of 200 kB, not the 100 an XREAD brings (20 MB);
    and Redis holds about two buffers of a client that stops reading, not all that was written."""
    from frontend.cluster import CLUSTER
    client, high, inv, remote = await _queued_many(redis_server, make_client, 100)
    # The remote client reads nothing for a while: what Redis holds of its output is bounded too
    # (the worker's window in bytes, the pump trims what it relayed), not the 20 MB written.
    redis, out = client.app[CLUSTER].redis, client.app[CLUSTER].keys.output(inv.id)
    held = 0
    for _ in range(50):
        held = max(held, int(await redis.memory_usage(out, samples=0) or 0))
        await asyncio.sleep(0.02)
    assert 0 < held <= 3_000_000, held                          # ~2 buffers of 500 kB ahead, one read
    events = [e["data"] async for e in iter_sse(remote)]
    assert [e[:4] for e in events[:-1]] == [f"{i:04d}" for i in range(100)] and events[-1] == "[DONE]"
    # Each XREAD brings up to 100 entries at once: without a byte bound the channel takes them all.
    assert 1 <= high[0] <= 2                                     # 2 writes of 200 kB in 500 kB, not 100


async def test_a_client_stalled_past_the_output_ttl_loses_nothing(redis_server, make_client):
    """The frontend renews the output stream's TTL while its client reads nothing: the unread entries
    do not expire (they did: the client got [DONE] with events missing, or an error at the end)."""
    _client, _high, _inv, remote = await _queued_many(redis_server, make_client, 150,
                                                     **{"cluster.outputTtlSeconds": 1})
    await asyncio.sleep(3)                                       # three TTLs without reading
    events = [e["data"] async for e in iter_sse(remote)]
    assert [e[:4] for e in events[:-1]] == [f"{i:04d}" for i in range(150)] and events[-1] == "[DONE]"


def test_a_frontend_acking_only_events_paces_the_worker_by_events():
    """The node version before acks `{inv:ID}:ack` only: the worker must not wait for a character
    count that never comes (it did, until the deadline)."""
    from runtime.cluster.worker_run import _Window
    window = _Window(events=100, max_bytes=1000)
    window.wrote(5, 2000)
    assert window.full()                                         # 2000 chars unread > 2 x 1000
    window.acked(b"3", None)                                     # an old frontend took 3 events
    assert not window.full()
    window.wrote(797, 0)
    assert not window.full()                                     # 799 events unread
    window.wrote(1, 0)
    assert window.full()                                         # 800: its bound, eight buffers of events
    window = _Window(events=100, max_bytes=1000)                 # this version acks both counts
    window.wrote(5, 2000)
    window.acked(b"3", b"1500")
    assert not window.full()
    window.wrote(1, 1600)
    assert window.full()                                         # 2100 chars unread
    window = _Window(events=100, max_bytes=1000)                 # bounded in bytes: 32 buffers of events
    window.wrote(3199, 0)
    assert not window.full()
    window.wrote(1, 0)
    assert window.full()


async def test_output_lost_on_its_way_through_redis_fails_the_invocation(redis_server, make_client, monkeypatch):
    """A data entry that never reaches the frontend (expired, evicted, a failover) is a gap in the
    entries' indexes: the client gets an error event, not an end that looks complete."""
    from runtime.cluster.worker import QueueConsumer
    original, data_writes = QueueConsumer._write, []

    async def lossy(self, inv_id, entries):
        if entries[0].get("t") == "data":
            data_writes.append(inv_id)
            if len(data_writes) == 3:
                return True                                       # "written", and gone
        return await original(self, inv_id, entries)
    monkeypatch.setattr(QueueConsumer, "_write", lossy)
    _client, _high, _inv, remote = await _queued_many(redis_server, make_client, 100)
    events = [e["data"] async for e in iter_sse(remote)]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert error["code"] == 4002 and "were lost" in error["message"], error
    got = [e[:4] for e in events[:-2]]
    assert got == [f"{i:04d}" for i in range(len(got))] and len(got) < 100   # in order up to the gap


async def test_a_data_entry_written_twice_is_relayed_once(redis_server, make_client, monkeypatch):
    """A pipeline resent after a dropped connection can write an entry twice: its index says so,
    and the client gets every write once (it was reported as lost output)."""
    from runtime.cluster.worker import QueueConsumer
    original, data_writes = QueueConsumer._write, []

    async def twice(self, inv_id, entries):
        if entries[0].get("t") == "data":
            data_writes.append(inv_id)
            if len(data_writes) == 3:
                await original(self, inv_id, entries)              # the first send, whose reply was lost
        return await original(self, inv_id, entries)
    monkeypatch.setattr(QueueConsumer, "_write", twice)
    _client, _high, _inv, remote = await _queued_many(redis_server, make_client, 100)
    events = [e["data"] async for e in iter_sse(remote)]
    assert [e[:4] for e in events[:-1]] == [f"{i:04d}" for i in range(100)] and events[-1] == "[DONE]"
