"""The official `runpod` SDK against fnstream's /v2 API (a real server over loopback)."""
from __future__ import annotations

import asyncio
import time

import pytest
import runpod
from runpod.endpoint.runner import Job as RunpodJob


@pytest.fixture
def sdk(jobs):
    """The SDK pointed at the in-process server; its calls are blocking, so tests run them in threads."""
    runpod.api_key = "unused-without-auth"
    runpod.endpoint_url_base = str(jobs.make_url("/v2"))
    return runpod


async def test_run_status_output(sdk, jobs):
    endpoint = sdk.Endpoint("echo-job")
    job = await asyncio.to_thread(endpoint.run, {"input": {"word": "hi"}})
    output = await asyncio.to_thread(job.output, 20)
    assert output == {"job_id": job.job_id, "input": {"word": "hi"}}
    assert await asyncio.to_thread(job.status) == "COMPLETED"
    # a bare dict is wrapped as {"input": ...} by the SDK
    job2 = await asyncio.to_thread(endpoint.run, {"word": "bare"})
    assert (await asyncio.to_thread(job2.output, 20))["input"] == {"word": "bare"}


async def test_stream_items_arrive_while_the_job_runs(sdk):
    """Job.stream() polls /stream once a second: items come in several polls, before the job ends."""
    job = await asyncio.to_thread(sdk.Endpoint("count").run, {"n": 5, "delay": 0.6})

    def collect() -> list[tuple[float, dict]]:
        return [(time.time(), item) for item in job.stream()]

    got = await asyncio.to_thread(collect)
    assert [item["i"] for _, item in got] == [0, 1, 2, 3, 4]
    first_arrival = got[0][0]
    last_produced = got[-1][1]["t"]
    assert first_arrival < last_produced, "the first item must arrive before the last is produced"
    assert await asyncio.to_thread(job.output) == [item for _, item in got]  # aggregated stream


async def test_run_sync(sdk):
    out = await asyncio.to_thread(sdk.Endpoint("acount").run_sync, {"input": {"n": 3}}, 30)
    assert out == ["token-0", "token-1", "token-2"]


async def test_run_sync_past_the_wait_polls_status(sdk, jobs):
    """/runsync?wait=... returns the current state; the SDK then polls /status until final."""
    resp = await jobs.post("/v2/sleeper/runsync?wait=100", json={"input": {"seconds": 0.5}})
    body = await resp.json()
    assert resp.status == 200 and body["status"] in ("IN_QUEUE", "IN_PROGRESS") and "output" not in body
    out = await asyncio.to_thread(RunpodJob("sleeper", body["id"], sdk.Endpoint("sleeper").rp_client).output, 20)
    assert out == "slept"


async def test_cancel(sdk):
    endpoint = sdk.Endpoint("sleeper")
    running = await asyncio.to_thread(endpoint.run, {"seconds": 30})
    queued = await asyncio.to_thread(endpoint.run, {"seconds": 30})
    assert await asyncio.to_thread(queued.status) == "IN_QUEUE"   # concurrency 1: it waits, no 429
    for job in (queued, running):
        answer = await asyncio.to_thread(job.cancel)
        assert answer == {"id": job.job_id, "status": "CANCELLED"}
        assert await asyncio.to_thread(job.status) == "CANCELLED"


async def test_health_and_purge_queue(sdk):
    endpoint = sdk.Endpoint("sleeper")
    jobs = [await asyncio.to_thread(endpoint.run, {"seconds": 30}) for _ in range(3)]
    for _ in range(100):
        health = await asyncio.to_thread(endpoint.health)
        if health["jobs"]["inProgress"] == 1:
            break
        await asyncio.sleep(0.02)
    assert health["jobs"]["inProgress"] == 1 and health["jobs"]["inQueue"] == 2
    assert health["workers"] == {"idle": 0, "running": 1}
    assert await asyncio.to_thread(endpoint.purge_queue) == {"removed": 2, "status": "completed"}
    assert [await asyncio.to_thread(j.status) for j in jobs[1:]] == ["CANCELLED", "CANCELLED"]
    await asyncio.to_thread(jobs[0].cancel)
    health = await asyncio.to_thread(endpoint.health)
    assert health["jobs"]["inQueue"] == 0 and health["jobs"]["cancelled"] == 3


async def test_failures_reach_the_sdk(sdk):
    for name, says in (("error-dict", "the input was unusable"), ("raises", "no widgets"),
                       ("yields-error", "went wrong after one item")):
        job = await asyncio.to_thread(sdk.Endpoint(name).run, {"x": 1})
        await asyncio.to_thread(job.output, 20)
        assert await asyncio.to_thread(job.status) == "FAILED"
        state = await asyncio.to_thread(job._fetch_job)
        assert says in state["error"], state


async def test_unknown_endpoint_raises_http_error(sdk):
    import requests

    with pytest.raises(requests.HTTPError) as info:
        await asyncio.to_thread(sdk.Endpoint("no-such-fn").run, {"x": 1})
    assert info.value.response.status_code == 404
    assert "not deployed" in info.value.response.json()["error"]
