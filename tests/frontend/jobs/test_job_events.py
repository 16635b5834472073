"""fnstream's job routes: GET /serverless/v1/jobs/{id}, its live SSE /events, DELETE; RunPod's
/stream in JSON and SSE form; a runpod-worker-ollama-shaped handler through /run and /stream."""
from __future__ import annotations

import asyncio
import json
import time

from tests.support.servers import read_events

SSE = {"Accept": "text/event-stream"}


async def run(client, fn: str, inp: dict) -> str:
    resp = await client.post(f"/v2/{fn}/run", json={"input": inp})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["status"] == "IN_QUEUE"
    return body["id"]


async def wait_final(client, job_id: str) -> dict:
    for _ in range(500):
        job = await (await client.get(f"/serverless/v1/jobs/{job_id}")).json()
        if job["status"] not in ("IN_QUEUE", "IN_PROGRESS"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish: {job}")


async def events(client, job_id: str, headers: dict | None = None) -> list[tuple[float, dict]]:
    resp = await client.get(f"/serverless/v1/jobs/{job_id}/events", headers=headers or {})
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    return await read_events(resp)


async def test_two_readers_get_every_item_live(jobs):
    job_id = await run(jobs, "count", {"n": 4, "delay": 0.3})
    a, b = await asyncio.gather(events(jobs, job_id), events(jobs, job_id))
    for got in (a, b):
        evs = [ev for _, ev in got]
        assert [ev["id"] for ev in evs[:4]] == ["1", "2", "3", "4"]
        assert [json.loads(ev["data"])["i"] for ev in evs[:4]] == [0, 1, 2, 3]
        assert evs[-1]["data"] == "[DONE]" and len(evs) == 5  # a generator's result is its items: no result event
        produced = [json.loads(ev["data"])["t"] for ev in evs[:4]]
        arrived = [t for t, _ in got[:4]]
        # each item arrives before the next one is produced (monotonic vs wall clock: compare gaps)
        assert produced[3] - produced[0] > 0.6
        assert arrived[3] - arrived[0] > 0.6, "items must arrive as produced, not all at the end"
    job = await wait_final(jobs, job_id)
    assert job["status"] == "COMPLETED" and job["outputCount"] == 4


async def test_last_event_id_resumes_and_reads_are_not_destructive(jobs):
    job_id = await run(jobs, "writer", {"n": 3})
    await wait_final(jobs, job_id)
    full = [ev for _, ev in await events(jobs, job_id)]
    assert [ev["data"] for ev in full] == ['{"n":0}', '{"n":1}', '{"n":2}',
                                            f'{{"ok":true,"got":{{"id":"{job_id}","input":{{"n":3}}}}}}', "[DONE]"]
    assert [ev["id"] for ev in full[:4]] == ["1", "2", "3", "4"]
    resumed = [ev for _, ev in await events(jobs, job_id, {"Last-Event-ID": "2"})]
    assert resumed == full[2:]
    after_result = [ev for _, ev in await events(jobs, job_id, {"Last-Event-ID": "4"})]
    assert [ev["data"] for ev in after_result] == ["[DONE]"]
    resp = await jobs.get(f"/serverless/v1/jobs/{job_id}/events?lastEventId=3")
    assert next(ev["data"] for _, ev in await read_events(resp)).startswith('{"ok":true')


async def test_resume_while_running(jobs):
    job_id = await run(jobs, "count", {"n": 4, "delay": 0.25})
    resp = await jobs.get(f"/serverless/v1/jobs/{job_id}/events")
    first = await read_events(resp, limit=2)
    resp.close()  # the reader drops mid-answer ...
    rest = [ev for _, ev in await events(jobs, job_id, {"Last-Event-ID": first[-1][1]["id"]})]
    assert [ev["id"] for ev in rest[:-1]] == ["3", "4"] and rest[-1]["data"] == "[DONE]"


async def test_failed_job_ends_with_its_error_event(jobs):
    job_id = await run(jobs, "yields-error", {})
    evs = [ev for _, ev in await events(jobs, job_id)]
    assert evs[0]["data"] == "fine" and evs[-1]["data"] == "[DONE]"
    error = json.loads(evs[-2]["data"])
    assert error["message"] == "went wrong after one item" and evs[-2]["id"] == str(len(evs) - 1)
    job = await wait_final(jobs, job_id)
    assert job["status"] == "FAILED" and job["error"]["message"] == "went wrong after one item"


async def test_runpod_stream_json_returns_each_item_once(jobs):
    job_id = await run(jobs, "count", {"n": 3, "delay": 0.2})
    seen: list[int] = []
    while True:
        body = await (await jobs.get(f"/v2/count/stream/{job_id}")).json()
        seen += [chunk["output"]["i"] for chunk in body["stream"]]
        if body["status"] == "COMPLETED" and not body["stream"]:
            break
        await asyncio.sleep(0.05)
    assert seen == [0, 1, 2]
    # /events still has everything: /stream's cursor does not consume the job
    assert len([ev for _, ev in await events(jobs, job_id)]) == 4


async def test_runpod_stream_sse_form(jobs):
    job_id = await run(jobs, "acount", {"n": 3, "delay": 0.2})
    resp = await jobs.get(f"/v2/acount/stream/{job_id}", headers=SSE)
    got = await read_events(resp)
    assert [ev["data"] for _, ev in got] == ["token-0", "token-1", "token-2", "[DONE]"]
    assert got[2][0] - got[0][0] > 0.3  # live, not at the end


async def test_ollama_shaped_handler_through_run_and_stream(jobs):
    """An async generator yielding self-framed `data: {...}\\n\\n` strings (rawStream: true)."""
    job_id = await run(jobs, "ollama", {"prompt": "why is the sky blue", "delay": 0.15})
    resp = await jobs.get(f"/v2/ollama/stream/{job_id}", headers=SSE)
    started = time.monotonic()
    got = await read_events(resp)
    datas = [ev["data"] for _, ev in got]
    assert datas[-1] == "[DONE]" and len(datas) == 6  # verbatim frames: not framed twice, no extra [DONE]
    words = "".join(json.loads(d)["choices"][0]["delta"]["content"] for d in datas[:-1])
    assert words == "why is the sky blue "
    assert got[0][0] - started < got[-1][0] - started - 0.3
    # the JSON form: each item is the raw string the handler yielded; output is the list of them
    body = await (await jobs.get(f"/v2/ollama/status/{job_id}")).json()
    assert body["status"] == "COMPLETED" and body["output"][0].startswith("data: {") and len(body["output"]) == 6
    stream = await (await jobs.get(f"/v2/ollama/stream/{job_id}")).json()
    assert [c["output"] for c in stream["stream"]] == body["output"]


async def test_delete_cancels(jobs):
    job_id = await run(jobs, "sleeper", {"seconds": 30})
    for _ in range(100):
        if (await (await jobs.get(f"/serverless/v1/jobs/{job_id}")).json())["status"] == "IN_PROGRESS":
            break
        await asyncio.sleep(0.02)
    resp = await jobs.delete(f"/serverless/v1/jobs/{job_id}")
    assert resp.status == 200 and (await resp.json())["status"] == "CANCELLED"
    evs = [ev for _, ev in await events(jobs, job_id)]
    assert json.loads(evs[0]["data"])["message"] == "the job was cancelled" and evs[-1]["data"] == "[DONE]"


async def test_list_jobs(jobs):
    ids = [await run(jobs, "echo-job", {"k": i}) for i in range(3)]
    listed = (await (await jobs.get("/serverless/v1/jobs?function=echo-job")).json())["jobs"]
    assert {j["id"] for j in listed} == set(ids)


async def test_process_executor_job(make_client, deploy_dir):
    """Jobs run through the ordinary path, so `executor: process` functions work too."""
    from tests.support.servers import fn, test_config

    client = await make_client(config=test_config(deploy_dir(fn("proc-count", "job_fns.count", executor="process",
                                                                   instances=1))))
    job_id = await run(client, "proc-count", {"n": 3, "delay": 0.1})
    evs = [ev for _, ev in await events(client, job_id)]
    assert [json.loads(ev["data"])["i"] for ev in evs[:3]] == [0, 1, 2] and evs[-1]["data"] == "[DONE]"
    body = await (await client.get(f"/v2/proc-count/status/{job_id}")).json()
    assert body["status"] == "COMPLETED" and [i["i"] for i in body["output"]] == [0, 1, 2]  # values, as in-process


async def test_process_executor_error_item_fails_the_job(make_client, deploy_dir):
    """RunPod: a generator's `{"error": ...}` item fails the job under `executor: process` as it
    does in-process; nothing after it is output."""
    from tests.support.servers import fn, test_config

    client = await make_client(config=test_config(deploy_dir(fn("proc-yields-error", "job_fns.yields_error",
                                                                   executor="process", instances=1))))
    resp = await client.post("/v2/proc-yields-error/runsync?wait=20000", json={"input": {}})
    body = await resp.json()
    assert body["status"] == "FAILED" and body["error"] == "went wrong after one item", body
    job = await (await client.get(f"/serverless/v1/jobs/{body['id']}/events")).read()
    assert b"never" not in job
