"""`jobs.cacheBytes`: finished jobs' inputs, outputs and results stay in memory only up to that many
bytes (the most recently finished); the others are stubs, read back from the store in full when a
route asks for them — every view answers as if they had stayed."""
from __future__ import annotations

from frontend.jobs import JOBS

BIG = "x" * 20_000


def held_bytes(manager) -> int:
    """Bytes of input, outputs and result the manager's finished jobs hold in memory."""
    total = 0
    for job in manager.jobs.values():
        if job.final and not job.cold:
            total += len(str(job.event)) + sum(len(str(i)) for i in job.outputs) + len(str(job.result or ""))
    return total


async def test_finished_jobs_beyond_cache_bytes_are_read_back_from_the_store(make_client, job_config):
    client = await make_client(config=job_config(**{"jobs.cacheBytes": 100_000}))
    manager = client.server.app[JOBS]
    ids = []
    for n in range(12):  # ~40 kB each (input, and the echo's result holds it again)
        body = await (await client.post("/v2/echo-job/runsync", json={"input": {"n": n, "pad": BIG}})).json()
        assert body["status"] == "COMPLETED", body
        ids.append(body["id"])
    assert held_bytes(manager) <= 100_000
    cold = [i for i in ids if manager.jobs[i].cold]
    assert ids[0] in cold and ids[-1] not in cold and len(cold) >= 8
    assert manager.jobs[ids[0]].event is None  # the input is not in memory any more
    # every view answers as before, read back from the store
    status = await (await client.get(f"/v2/echo-job/status/{ids[0]}")).json()
    assert status["status"] == "COMPLETED" and status["output"]["input"] == {"n": 0, "pad": BIG}
    shown = await (await client.get(f"/serverless/v1/jobs/{ids[1]}")).json()
    assert shown["result"]["input"]["n"] == 1 and shown["status"] == "COMPLETED"
    listed = {j["id"]: j for j in (await (await client.get("/serverless/v1/jobs")).json())["jobs"]}
    assert listed[ids[2]]["status"] == "COMPLETED" and listed[ids[2]]["outputCount"] == 0
    assert held_bytes(manager) <= 100_000  # reading jobs back keeps the bound


async def test_a_cold_generator_job_streams_all_its_items(make_client, job_config):
    client = await make_client(config=job_config(**{"jobs.cacheBytes": 1000}))
    manager = client.server.app[JOBS]
    body = await (await client.post("/v2/big/runsync", json={"input": {"n": 5, "size": 500}})).json()
    assert body["status"] == "COMPLETED" and len(body["output"]) == 5
    job = manager.jobs[body["id"]]
    assert job.cold and job.outputs == []  # 2.5 kB of output: beyond the cache
    listed = (await (await client.get("/serverless/v1/jobs")).json())["jobs"]
    assert listed[0]["outputCount"] == 5 and listed[0]["outputBytes"] == 2500
    resp = await client.get(f"/serverless/v1/jobs/{body['id']}/events")
    text = await resp.text()
    assert text.count("x" * 500) == 5 and text.endswith("data: [DONE]\n\n")
    stream = await (await client.post(f"/v2/big/stream/{body['id']}")).json()
    assert len(stream["stream"]) == 5
    assert (await (await client.post(f"/v2/big/stream/{body['id']}")).json())["stream"] == []  # cursor kept
    # a retried cold job runs with its input read back
    failed = await (await client.post("/v2/raises/runsync", json={"input": {"k": BIG}})).json()
    assert failed["status"] == "FAILED" and manager.jobs[failed["id"]].cold
    again = await (await client.post(f"/v2/raises/retry/{failed['id']}")).json()
    assert again["status"] == "IN_QUEUE"
    await manager.wait(manager.jobs[failed["id"]], 10)
    retried = await (await client.get(f"/v2/raises/status/{failed['id']}")).json()
    assert retried["status"] == "FAILED" and retried["retries"] == 1


async def test_a_restart_loads_finished_jobs_as_stubs(tmp_path):
    """At start only unfinished jobs are read in full: a finished one's input and outputs stay in
    the store (a restart does not read every kept job into memory), a small result stays on the stub."""
    from runtime.jobs.model import Job
    from runtime.jobs.store import SqliteJobStore

    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path)
    await store.open()
    done = Job(id="done", function="f", tenant="t", event={"pad": BIG}, status="COMPLETED", result={"ok": 1},
               completed_at=1.0, output_bytes=6)
    large = Job(id="large", function="f", tenant="t", event={}, status="FAILED", result=BIG, completed_at=1.0)
    running = Job(id="running", function="f", tenant="t", event={"pad": BIG}, status="IN_PROGRESS")
    for job in (done, large, running):
        await store.save(job)
    await store.add_outputs("done", 1, ["a", "b"], 2)
    await store.add_outputs("running", 1, ["c"], 1)
    await store.close()

    store = SqliteJobStore(path)
    await store.open()
    loaded = {j.id: j for j in await store.load()}
    assert loaded["done"].cold and loaded["done"].event is None and loaded["done"].outputs == []
    assert loaded["done"].output_count() == 2 and loaded["done"].result == {"ok": 1}
    assert loaded["done"].stored_input == len('{"pad":"' + BIG + '"}')
    assert loaded["large"].cold and loaded["large"].result is None  # read back when asked for
    assert not loaded["running"].cold and loaded["running"].event == {"pad": BIG}
    assert loaded["running"].outputs == ["c"]
    full = await store.read_job("done")
    assert full is not None and full.event == {"pad": BIG} and full.outputs == ["a", "b"]
    await store.close()
