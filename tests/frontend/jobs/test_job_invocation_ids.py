"""A job's answers name the invocation that runs it (`X-Invocation-Id`, issue 28 §1): the id is made
at submit time and the run's invocation takes it, so the /run answer, the run's log lines and the
later answers name one id; a retry is a new run with a new id."""
from __future__ import annotations

import re

from tests.support.waiting import eventually

ID = re.compile(r"[A-Za-z0-9_-]{22}")  # 128 random bits, as every invocation's
INVOKE = "/serverless/v1/functions/{}/invocations".format


async def _finished(client, job_id: str) -> dict:
    async def done() -> dict | None:
        body = await (await client.get(f"/v2/log-ids/status/{job_id}")).json()
        return body if body["status"] in ("COMPLETED", "FAILED") else None
    return await eventually(done)


async def test_run_answers_the_id_its_run_logs_under(jobs):
    resp = await jobs.post("/v2/log-ids/run", json={"input": {}})
    assert resp.status == 200
    inv_id = resp.headers["X-Invocation-Id"]
    assert ID.fullmatch(inv_id)
    job_id = (await resp.json())["id"]
    status = await _finished(jobs, job_id)
    assert status["output"] == {"invocation_id": inv_id}  # the handler's log context names it
    for path in (f"/v2/log-ids/status/{job_id}", f"/v2/log-ids/stream/{job_id}",
                 f"/serverless/v1/jobs/{job_id}", f"/serverless/v1/jobs/{job_id}/events"):
        answer = await jobs.get(path)
        await answer.read()
        assert answer.status == 200 and answer.headers["X-Invocation-Id"] == inv_id, path
    assert (await (await jobs.get(f"/serverless/v1/jobs/{job_id}")).json())["invocationId"] == inv_id


async def test_runsync_and_idempotent_replays_name_the_same_id(jobs):
    first = await jobs.post("/v2/log-ids/runsync", json={"input": {}}, headers={"Idempotency-Key": "k1"})
    body = await first.json()
    assert body["output"] == {"invocation_id": first.headers["X-Invocation-Id"]}
    again = await jobs.post("/v2/log-ids/runsync", json={"input": {}}, headers={"Idempotency-Key": "k1"})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["X-Invocation-Id"] == first.headers["X-Invocation-Id"]
    run = await jobs.post("/v2/log-ids/run", json={"input": {}}, headers={"Idempotency-Key": "k2"})
    replay = await jobs.post("/v2/log-ids/run", json={"input": {}}, headers={"Idempotency-Key": "k2"})
    assert replay.headers["X-Invocation-Id"] == run.headers["X-Invocation-Id"] != first.headers["X-Invocation-Id"]


async def test_openyuanrong_async_answers_name_the_run(jobs):
    resp = await jobs.post(INVOKE("log-ids"), json={"input": {}}, headers={"X-Invoke-Type": "async"})
    assert resp.status == 202
    inv_id = resp.headers["X-Invocation-Id"]
    request_id = (await resp.json())["requestId"]

    async def result() -> dict | None:
        got = await jobs.get(f"/serverless/v1/functions/async-results/{request_id}")
        body = await got.json()
        return (got, body) if body["status"] == "completed" else None
    got, body = await eventually(result)
    assert got.headers["X-Invocation-Id"] == inv_id and body["respBody"] == {"invocation_id": inv_id}


async def test_a_retry_is_a_new_run_with_a_new_id(jobs):
    resp = await jobs.post("/v2/yields-error/run", json={"input": {}})
    first = resp.headers["X-Invocation-Id"]
    job_id = (await resp.json())["id"]

    async def failed() -> bool:
        return (await (await jobs.get(f"/v2/yields-error/status/{job_id}")).json())["status"] == "FAILED"
    await eventually(failed)
    retry = await jobs.post(f"/v2/yields-error/retry/{job_id}")
    assert retry.status == 200
    second = retry.headers["X-Invocation-Id"]
    assert ID.fullmatch(second) and second != first
    status = await jobs.get(f"/v2/yields-error/status/{job_id}")
    assert status.headers["X-Invocation-Id"] == second


async def test_the_invocation_events_route_reads_a_jobs_run(jobs):
    resp = await jobs.post("/v2/count/run", json={"input": {"n": 3}})
    inv_id = resp.headers["X-Invocation-Id"]
    job_id = (await resp.json())["id"]
    await eventually(lambda: _done(jobs, "count", job_id))
    by_job = await (await jobs.get(f"/serverless/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "1"})).read()
    got = await jobs.get(f"/serverless/v1/invocations/{inv_id}/events", headers={"Last-Event-ID": "1"})
    assert got.status == 200 and got.headers["X-Job-Id"] == job_id
    body = await got.read()
    assert body == by_job and b"id: 2\n" in body and body.endswith(b"data: [DONE]\n\n")
    assert (await jobs.get("/serverless/v1/invocations/" + "z" * 22 + "/events")).status == 404


async def _done(client, function: str, job_id: str) -> bool:
    body = await (await client.get(f"/v2/{function}/status/{job_id}")).json()
    return body["status"] == "COMPLETED"


async def test_another_tenant_cannot_read_a_jobs_run_by_its_id(make_client, job_config):
    from tests.support.tenants import bearer

    tokens = [{"token": "user-a", "tenant": "default", "role": "user"},
              {"token": "user-b", "tenant": "acme", "role": "user"}]
    client = await make_client(config=job_config(**{"auth.tokens": tokens}))
    resp = await client.post("/v2/echo-job/run", json={"input": {}}, headers=bearer("user-a"))
    inv_id = resp.headers["X-Invocation-Id"]
    url = f"/serverless/v1/invocations/{inv_id}/events"
    assert (await client.get(url, headers=bearer("user-b"))).status == 404
    mine = await client.get(url, headers=bearer("user-a"))
    assert mine.status == 200 and (await mine.read()).endswith(b"data: [DONE]\n\n")
