"""Cluster mode: jobs in Redis, so any frontend answers /status, /stream and /events of a job
another node runs, and a cancel sent to any node stops it."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import yaml

from frontend.client import iter_sse
from tests.support.cluster import FAST
from tests.support.servers import FUNCTIONS, HANDLERS, fn


def node_args(url: str, deploy) -> list[str]:
    return ["--cluster", url, *FAST, "-s", "cluster.role=all", "--deploy-dir", str(deploy),
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}"]


async def wait_status(s, base, fn_name, job_id, want, limit=20.0) -> dict:
    deadline = time.monotonic() + limit
    while True:
        async with s.get(f"{base}/v2/{fn_name}/status/{job_id}") as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        if body["status"] in want:
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.05)


async def test_any_node_answers_for_a_job_another_runs(redis_server, start_server, tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("count", "job_fns.count"),
                                                     fn("sleeper", "job_fns.sleeper")]))
    a = start_server(*node_args(redis_server.url, deploy), env={"FNSTREAM_LOG": "WARNING"})
    b = start_server(*node_args(redis_server.url, deploy), env={"FNSTREAM_LOG": "WARNING"})
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{a.url}/v2/count/run", json={"input": {"n": 4, "delay": 0.3}}) as r:
            job_id = (await r.json())["id"]
        # B reads the job A runs: live SSE, items as produced
        got = []
        async with s.get(f"{b.url}/serverless/v1/jobs/{job_id}/events") as r:
            assert r.status == 200
            async for ev in iter_sse(r):
                got.append((time.monotonic(), ev))
        items = [json.loads(ev["data"]) for _, ev in got[:-1]]
        assert [i["i"] for i in items] == [0, 1, 2, 3] and got[-1][1]["data"] == "[DONE]"
        assert [ev["id"] for _, ev in got[:-1]] == ["1", "2", "3", "4"]
        assert got[3][0] - got[0][0] > 0.5  # live, not all at the end
        body = await wait_status(s, b.url, "count", job_id, {"COMPLETED"})
        assert body["output"] == items
        async with s.get(f"{b.url}/serverless/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "3"}) as r:
            assert [ev["data"] for ev in [e async for e in iter_sse(r)]][-1] == "[DONE]"

        # RunPod's /stream cursor is shared: asked of either node, each item comes back once
        async with s.post(f"{a.url}/v2/count/run", json={"input": {"n": 6, "delay": 0.1}}) as r:
            job_id = (await r.json())["id"]
        seen = []
        for turn in range(200):
            base = (a, b)[turn % 2].url
            async with s.get(f"{base}/v2/count/stream/{job_id}") as r:
                body = await r.json()
            seen += [c["output"]["i"] for c in body["stream"]]
            if body["status"] == "COMPLETED" and not body["stream"]:
                break
            await asyncio.sleep(0.05)
        assert seen == [0, 1, 2, 3, 4, 5]

        # a cancel asked of B stops the job running on A
        async with s.post(f"{a.url}/v2/sleeper/run", json={"input": {"seconds": 30}}) as r:
            job_id = (await r.json())["id"]
        await wait_status(s, b.url, "sleeper", job_id, {"IN_PROGRESS"})
        async with s.post(f"{b.url}/v2/sleeper/cancel/{job_id}") as r:
            assert await r.json() == {"id": job_id, "status": "CANCELLED"}
        async with s.get(f"{a.url}/serverless/v1/jobs/{job_id}") as r:
            assert (await r.json())["status"] == "CANCELLED"
        async with s.get(f"{b.url}/serverless/v1/jobs/nope") as r:
            assert r.status == 404


async def test_a_frontend_node_queues_jobs_for_the_cluster_workers(redis_server, start_server, start_worker):
    """`cluster.role: frontend`: the job runs on a `fnstream worker`, its items reach the job live."""
    from tests.support.cluster import CLUSTER_FUNCTIONS

    frontend = start_server("--cluster", redis_server.url, *FAST, "-s", "cluster.role=frontend",
                            env={"FNSTREAM_LOG": "WARNING"})
    worker = start_worker(redis_server.url)
    relay = {"name": "relay", "handler": "relay.handler", "codePath": str(CLUSTER_FUNCTIONS), "timeout": 30}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{frontend.url}/admin/v1/functions", json=relay) as r:
            assert r.status == 201, await r.text()
        deadline = time.monotonic() + 15
        while True:
            async with s.get(f"{frontend.url}/cluster/v1/status") as r:
                if any("relay" in w["functions"] for w in (await r.json())["workers"]):
                    break
            assert time.monotonic() < deadline, "no worker serves relay"
            await asyncio.sleep(0.05)
        async with s.post(f"{frontend.url}/serverless/v1/functions/relay/invocations",
                          json={"count": 4, "delay_ms": 300}, headers={"X-Invoke-Type": "async"}) as r:
            assert r.status == 202, await r.text()
            request_id = (await r.json())["requestId"]
        got = []
        async with s.get(f"{frontend.url}/serverless/v1/jobs/{request_id}/events") as r:
            async for ev in iter_sse(r):
                got.append((time.monotonic(), ev["data"]))
        items = [json.loads(d) for _, d in got[:4]]
        assert [i["i"] for i in items] == [1, 2, 3, 4] and {i["pid"] for i in items} == {worker.pid}
        assert json.loads(got[4][1]) == {"count": 4, "pid": worker.pid} and got[-1][1] == "[DONE]"
        assert got[3][0] - got[0][0] > 0.5  # live
        async with s.get(f"{frontend.url}/serverless/v1/functions/async-results/{request_id}") as r:
            body = await r.json()
        assert body["status"] == "completed" and body["respBody"] == {"count": 4, "pid": worker.pid}


async def test_a_dead_nodes_jobs_are_taken_over_by_a_live_one(redis_server, start_server, tmp_path):
    """Kill -9 of the node that accepted three jobs: another node runs the queued one and the
    running one that had no output yet, and fails the one that had written output (as a restart)."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("count", "job_fns.count"),
                                                     fn("sleeper", "job_fns.sleeper", concurrency=1)]))
    args = [*node_args(redis_server.url, deploy), "-s", "jobs.takeoverSeconds=1"]
    a = start_server(*args, env={"FNSTREAM_LOG": "WARNING"})
    b = start_server(*args, env={"FNSTREAM_LOG": "WARNING"})
    async with aiohttp.ClientSession() as s:
        async def run(fn_name: str, payload: dict) -> str:
            async with s.post(f"{a.url}/v2/{fn_name}/run", json={"input": payload}) as r:
                assert r.status == 200, await r.text()
                return (await r.json())["id"]

        running = await run("sleeper", {"seconds": 4})
        queued = await run("sleeper", {"seconds": 0.1})
        half_done = await run("count", {"n": 100, "delay": 0.2})
        await wait_status(s, b.url, "sleeper", running, {"IN_PROGRESS"})
        deadline = time.monotonic() + 20
        while True:  # the count job has written output that B can see
            async with s.get(f"{b.url}/serverless/v1/jobs/{half_done}") as r:
                if (await r.json())["outputCount"] > 0:
                    break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        for job_id, want in ((running, {"IN_PROGRESS"}), (queued, {"IN_QUEUE", "IN_PROGRESS"})):
            async with s.get(f"{b.url}/v2/sleeper/status/{job_id}") as r:
                assert (await r.json())["status"] in want   # (a job may also run on B through the work queue)

        a.kill()
        assert (await wait_status(s, b.url, "sleeper", running, {"COMPLETED"}, limit=30))["output"] == "slept"
        assert (await wait_status(s, b.url, "sleeper", queued, {"COMPLETED"}, limit=30))["output"] == "slept"
        failed = await wait_status(s, b.url, "count", half_done, {"FAILED"}, limit=30)
        assert "the node running it stopped" in json.dumps(failed)
        async with s.get(f"{b.url}/serverless/v1/jobs/{running}") as r:
            assert (await r.json())["status"] == "COMPLETED"   # B owns it now: its own job list has it


async def test_a_node_that_was_only_slow_finds_its_writes_to_a_taken_job_refused(redis_server):
    """The lease lapsed while node A stalled: B takes A's job; A's late writes never reach it."""
    from runtime.cluster.job_store import connect_store
    from runtime.jobs.model import Job

    a = connect_store(redis_server.url, "fence", 60, 0.3)
    b = connect_store(redis_server.url, "fence", 60, 0.3)
    await a.open()
    await b.open()
    try:
        job = Job(id="j1", function="f", tenant="t", event={"x": 1}, status="IN_PROGRESS")
        await a.save(job)
        a._leaser.cancel()                       # A stalls: its lease is not renewed
        await asyncio.sleep(0.5)
        taken: list[Job] = []
        assert await b.claim_orphans(taken.append) == 1
        assert [(j.id, j.status) for j in taken] == [("j1", "IN_PROGRESS")]
        assert await b.claim_orphans(taken.append) == 0          # taken once
        job.status, job.completed_at = "COMPLETED", time.time()  # A wakes up and finishes it
        await a.add_outputs("j1", 1, ["late"])
        await a.save(job)
        stored = await b.fetch("j1")
        assert stored is not None and stored.status == "IN_PROGRESS" and stored.outputs == []
        taken[0].status = "IN_QUEUE"                              # B's own writes go through
        await b.save(taken[0])
        assert (await b.fetch("j1")).status == "IN_QUEUE"
    finally:
        await a.close()
        await b.close()


async def test_a_stalled_node_stops_running_a_job_another_node_took(redis_server, make_client):
    """Node A stalls past its lease while running a job; B takes it. A's next write is refused, and
    A then stops the job's handler (it went on writing, side effects and all, beside the taker's),
    forgets the job and announces no end of it (no webhook, no metric)."""
    from frontend.jobs import JOBS
    from frontend.metrics_counters import JOB_METRICS
    from runtime.cluster.job_store import connect_store
    from tests.support.cluster import wait_until
    from tests.support.servers import make_config

    cfg = make_config(**{"cluster.redisUrl": redis_server.url, "cluster.workerHeartbeatSeconds": 0.2,
                         "runtime.codeRoots": [str(FUNCTIONS), str(HANDLERS)], "jobs.store": "redis",
                         "jobs.takeoverSeconds": 0.3})
    client = await make_client(cfg)
    r = await client.post("/admin/v1/functions", json=fn("acount", "job_fns.acount", timeout=60))
    assert r.status == 201, await r.text()
    manager = client.app[JOBS]
    finished = client.app[JOB_METRICS].finished  # counted by the manager's on_final hook
    r = await client.post("/v2/acount/run", json={"input": {"n": 10_000, "delay": 0.02}})
    assert r.status == 200, await r.text()
    job_id = (await r.json())["id"]

    async def writing():
        return job_id in manager._running and len(manager.jobs[job_id].outputs) > 2
    await wait_until(writing, "the job to run and write output")
    store = manager.shared
    assert store is not None
    follower = asyncio.create_task(manager.wait(manager.jobs[job_id], 60))  # a /status?wait=... on A
    store._leaser.cancel()                         # A stalls: its lease is not renewed
    taker = connect_store(redis_server.url, "fnstream", 60, 0.3)
    await taker.open()
    try:
        taken: list = []

        async def took():
            await taker.claim_orphans(taken.append)
            return taken
        await wait_until(took, "B to take A's job once A's lease lapsed")
        assert [j.id for j in taken] == [job_id]

        async def stopped():
            return job_id not in manager._running and job_id not in manager.jobs
        await wait_until(stopped, "A to stop running the job it lost")
        stored = await taker.fetch(job_id)
        assert stored is not None and stored.status == "IN_PROGRESS"   # as B took it: A wrote no end
        assert finished == {}   # no end announced on A (its only job): no metric, and so no webhook
        assert not follower.done()
        stored.status, stored.completed_at = "COMPLETED", time.time()   # B finishes it
        await taker.save(stored)

        async def followed():
            return follower.done()
        await wait_until(followed, "A's waiter to see B's end of the job")  # it waited on A's own copy
    finally:
        follower.cancel()
        await taker.close()


async def test_a_job_taken_over_while_being_dispatched_is_not_run_and_the_queue_goes_on(redis_server,
                                                                                         make_client):
    """The refusal can come while the job's dispatch is awaited: the invocation just started is
    cancelled, and the function's job queue keeps running (its dispatcher died on the missing id)."""
    from frontend.jobs import JOBS
    from tests.support.cluster import wait_until
    from tests.support.servers import make_config

    cfg = make_config(**{"cluster.redisUrl": redis_server.url, "cluster.workerHeartbeatSeconds": 0.2,
                         "runtime.codeRoots": [str(FUNCTIONS), str(HANDLERS)], "jobs.store": "redis"})
    client = await make_client(cfg)
    r = await client.post("/admin/v1/functions", json=fn("acount", "job_fns.acount", timeout=60))
    assert r.status == 201, await r.text()
    manager = client.app[JOBS]
    dispatch, started = manager.dispatcher.dispatch, []

    async def taken_meanwhile(principal, function, event, options):
        inv = await dispatch(principal, function, event, options)
        started.append(inv)
        if len(started) == 1:
            manager._taken_from_us(next(iter(manager.jobs)))   # what a refused write calls
        return inv
    manager.dispatcher.dispatch = taken_meanwhile  # type: ignore[method-assign]
    r = await client.post("/v2/acount/run", json={"input": {"n": 10_000, "delay": 0.02}})
    assert r.status == 200, await r.text()

    async def first_started():
        return started
    await wait_until(first_started, "the first job's dispatch")
    assert started[0].cancel_reason == "another node took the job over"
    r = await client.post("/v2/acount/runsync", json={"input": {"n": 2}})
    assert r.status == 200, await r.text()
    assert (await r.json())["status"] == "COMPLETED"       # the function's queue still runs jobs


async def test_a_job_run_by_a_cluster_worker_keeps_its_items_values_and_runpods_error_item(
        redis_server, start_server, start_worker):
    """A job's generator items are its output as values (dicts stay dicts), and RunPod's yielded
    `{"error": ...}` fails the job — on a cluster worker as in one process. Through the queue the
    items used to arrive as their JSON text: strings in the output, and the error item unseen."""
    from tests.support.cluster import workers_serving

    roots = ["-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}"]
    frontend = start_server("--cluster", redis_server.url, *FAST, *roots, "-s", "cluster.role=frontend",
                            env={"FNSTREAM_LOG": "WARNING"})
    start_worker(redis_server.url, *roots)
    async with aiohttp.ClientSession() as s:
        for manifest in (fn("count", "job_fns.count"), fn("yields-error", "job_fns.yields_error"),
                         fn("acount", "job_fns.acount")):
            async with s.post(f"{frontend.url}/admin/v1/functions", json=manifest) as r:
                assert r.status == 201, await r.text()
            await workers_serving(s, frontend.url, manifest["name"])
        async with s.post(f"{frontend.url}/v2/count/runsync?wait=20000", json={"input": {"n": 3}}) as r:
            body = await r.json()
        assert body["status"] == "COMPLETED", body
        assert [item["i"] for item in body["output"]] == [0, 1, 2]           # values, not JSON text
        async with s.post(f"{frontend.url}/v2/acount/runsync?wait=20000", json={"input": {"n": 2}}) as r:
            assert (await r.json())["output"] == ["token-0", "token-1"]       # text items stay text
        async with s.post(f"{frontend.url}/v2/yields-error/runsync?wait=20000", json={"input": {}}) as r:
            body = await r.json()
        assert body["status"] == "FAILED" and "went wrong after one item" in body["error"], body


async def test_health_the_job_list_and_purge_are_cluster_wide(redis_server, start_server, tmp_path):
    """Asked of B, /health counts, the job list and purge-queue take in the jobs A holds (they
    were B's own only: 0 queued, an empty list, nothing purged)."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("sleeper", "job_fns.sleeper", concurrency=1)]))
    a = start_server(*node_args(redis_server.url, deploy), env={"FNSTREAM_LOG": "WARNING"})
    b = start_server(*node_args(redis_server.url, deploy), env={"FNSTREAM_LOG": "WARNING"})
    async with aiohttp.ClientSession() as s:
        ids = []
        for _ in range(3):   # on A: one runs, two wait for its slot
            async with s.post(f"{a.url}/v2/sleeper/run", json={"input": {"seconds": 30}}) as r:
                ids.append((await r.json())["id"])
        await wait_status(s, a.url, "sleeper", ids[0], {"IN_PROGRESS"})
        async with s.get(f"{b.url}/v2/sleeper/health") as r:
            counts = (await r.json())["jobs"]
        assert (counts["inProgress"], counts["inQueue"]) == (1, 2), counts
        async with s.get(f"{b.url}/serverless/v1/jobs", params={"function": "sleeper"}) as r:
            listed = [j["id"] for j in (await r.json())["jobs"]]
        assert listed == ids[::-1]   # newest first
        async with s.post(f"{b.url}/v2/sleeper/purge-queue") as r:
            assert (await r.json())["removed"] == 2
        for job_id in ids[1:]:
            await wait_status(s, a.url, "sleeper", job_id, {"CANCELLED"})
        assert (await wait_status(s, a.url, "sleeper", ids[0], {"IN_PROGRESS"}))["status"] == "IN_PROGRESS"
