"""Every bad input to the job routes gets a clear 4xx in the route's shape: RunPod routes
`{"error"}`, fnstream/openYuanrong routes `{"code","message"}`; limits; tenants."""
from __future__ import annotations

import asyncio

import pytest

from tests.support.servers import fn

INVOKE = "/serverless/v1/functions/{}/invocations"


async def runpod_error(resp, status: int) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert set(body) == {"error"}, body
    return body["error"]


async def fnstream_error(resp, status: int) -> dict:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert {"code", "message"} <= set(body), body
    return body


async def started(client, fn_name: str, inp: dict) -> str:
    job_id = (await (await client.post(f"/v2/{fn_name}/run", json={"input": inp})).json())["id"]
    for _ in range(200):
        if (await (await client.get(f"/v2/{fn_name}/status/{job_id}")).json())["status"] == "IN_PROGRESS":
            return job_id
        await asyncio.sleep(0.02)
    raise AssertionError("job did not start")


@pytest.mark.parametrize("body, says", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", '"input" key'),
    (b'{"inputs": {}}', '"input" key'),
    (b'{"input": {}, "policy": []}', "policy must be an object"),
    (b'{"input": {}, "policy": {"ttl": -5}}', "policy.ttl"),
    (b'{"input": {}, "policy": {"executionTimeout": "10"}}', "policy.executionTimeout"),
    (b'{"input": {}, "webhook": 12}', "webhook must be"),
])
async def test_bad_run_bodies(jobs, body, says):
    for route in ("run", "runsync"):
        resp = await jobs.post(f"/v2/echo-job/{route}", data=body, headers={"Content-Type": "application/json"})
        assert says in await runpod_error(resp, 400)


async def test_unknown_function_and_job(jobs):
    assert "not deployed" in await runpod_error(await jobs.post("/v2/nope/run", json={"input": {}}), 404)
    assert "not deployed" in await runpod_error(await jobs.get("/v2/nope/health"), 404)
    for method, path in (("GET", "/v2/echo-job/status/nope"), ("GET", "/v2/echo-job/stream/nope"),
                         ("POST", "/v2/echo-job/cancel/nope"), ("POST", "/v2/echo-job/retry/nope")):
        assert "not found" in await runpod_error(await jobs.request(method, path), 404)
    for method, path in (("GET", "/serverless/v1/jobs/nope"), ("GET", "/serverless/v1/jobs/nope/events"),
                         ("DELETE", "/serverless/v1/jobs/nope")):
        assert (await fnstream_error(await jobs.request(method, path), 404))["code"] == 200404
    resp = await jobs.post(INVOKE.format("nope"), json={}, headers={"X-Invoke-Type": "async"})
    body = await fnstream_error(resp, 404)
    assert body["code"] == 150424


async def test_job_of_another_function_is_not_found(jobs):
    job_id = (await (await jobs.post("/v2/echo-job/run", json={"input": {}})).json())["id"]
    assert "not found" in await runpod_error(await jobs.get(f"/v2/acount/status/{job_id}"), 404)


async def test_cancel_finished_and_retry_running(jobs):
    job_id = (await (await jobs.post("/v2/echo-job/runsync", json={"input": {}})).json())["id"]
    says = await runpod_error(await jobs.post(f"/v2/echo-job/cancel/{job_id}"), 409)
    assert "already COMPLETED" in says
    assert "only a FAILED or TIMED_OUT" in await runpod_error(await jobs.post(f"/v2/echo-job/retry/{job_id}"), 409)
    body = await fnstream_error(await jobs.delete(f"/serverless/v1/jobs/{job_id}"), 409)
    assert body["code"] == 200409
    running = await started(jobs, "sleeper", {"seconds": 30})
    assert "IN_PROGRESS" in await runpod_error(await jobs.post(f"/v2/sleeper/retry/{running}"), 409)
    await jobs.post(f"/v2/sleeper/cancel/{running}")


async def test_retry_runs_a_failed_job_again(jobs):
    job = await (await jobs.post("/v2/raises/runsync", json={"input": {}})).json()
    assert job["status"] == "FAILED"
    resp = await jobs.post(f"/v2/raises/retry/{job['id']}")
    assert await resp.json() == {"id": job["id"], "status": "IN_QUEUE"}
    for _ in range(200):
        again = await (await jobs.get(f"/v2/raises/status/{job['id']}")).json()
        if again["status"] == "FAILED":
            break
        await asyncio.sleep(0.02)
    assert again["status"] == "FAILED" and again["retries"] == 1
    assert (await (await jobs.get("/v2/raises/health")).json())["jobs"]["retried"] == 1


async def test_bad_query_values(jobs):
    resp = await jobs.post("/v2/echo-job/runsync?wait=soon", json={"input": {}})
    assert "wait must be" in await runpod_error(resp, 400)
    job_id = (await (await jobs.post("/v2/echo-job/runsync", json={"input": {}})).json())["id"]
    resp = await jobs.get(f"/serverless/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "x1"})
    assert "Last-Event-ID" in (await fnstream_error(resp, 400))["message"]
    assert "limit" in (await fnstream_error(await jobs.get("/serverless/v1/jobs?limit=0"), 400))["message"]


async def test_max_queued_is_429(make_client, job_config):
    client = await make_client(config=job_config(**{"jobs.maxQueued": 2}))
    await started(client, "sleeper", {"seconds": 30})  # running: not queued
    for _ in range(2):
        assert (await client.post("/v2/sleeper/run", json={"input": {"seconds": 30}})).status == 200
    says = await runpod_error(await client.post("/v2/sleeper/run", json={"input": {}}), 429)
    assert "jobs.maxQueued" in says
    resp = await client.post(INVOKE.format("sleeper"), json={}, headers={"X-Invoke-Type": "async"})
    assert (await fnstream_error(resp, 429))["code"] == 200429
    assert (await (await client.post("/v2/sleeper/purge-queue")).json())["removed"] == 2


async def test_output_limit_fails_the_job(make_client, job_config):
    client = await make_client(config=job_config(**{"jobs.maxOutputBytes": 5000}))
    job = await (await client.post("/v2/big/runsync", json={"input": {"n": 10, "size": 1000}})).json()
    assert job["status"] == "FAILED" and "jobs.maxOutputBytes" in job["error"]
    full = await (await client.get(f"/serverless/v1/jobs/{job['id']}")).json()
    assert full["statusCode"] == 413 and full["outputCount"] <= 5


async def test_execution_timeout_and_ttl(jobs):
    job = await (await jobs.post("/v2/sleeper/runsync", json={"input": {"seconds": 5},
                                                             "policy": {"executionTimeout": 300}})).json()
    assert job["status"] == "TIMED_OUT" and "executionTimeout of 0.3 s" in job["error"]
    blocker = await started(jobs, "sleeper", {"seconds": 30})
    resp = await jobs.post("/v2/sleeper/run", json={"input": {}, "policy": {"ttl": 100}})
    job_id = (await resp.json())["id"]
    await asyncio.sleep(0.3)
    await jobs.post(f"/v2/sleeper/cancel/{blocker}")
    for _ in range(100):
        status = await (await jobs.get(f"/v2/sleeper/status/{job_id}")).json()
        if status["status"] != "IN_QUEUE":
            break
        await asyncio.sleep(0.02)
    assert status["status"] == "TIMED_OUT" and "ttl" in status["error"]


async def test_execution_timeout_never_beyond_the_function_timeout(make_client, deploy_dir):
    from tests.support.servers import test_config

    config = test_config(deploy_dir(fn("short", "job_fns.sleeper", timeout=0.3)))
    client = await make_client(config=config)
    job = await (await client.post("/v2/short/runsync", json={"input": {"seconds": 5},
                                                             "policy": {"executionTimeout": 60000}})).json()
    assert job["status"] == "TIMED_OUT"


async def test_retention_expires_finished_jobs(make_client, job_config):
    client = await make_client(config=job_config(**{"jobs.retentionSeconds": 0.2}))
    job_id = (await (await client.post("/v2/echo-job/runsync", json={"input": {}})).json())["id"]
    assert (await client.get(f"/v2/echo-job/status/{job_id}")).status == 200
    await asyncio.sleep(0.5)
    assert (await client.get(f"/v2/echo-job/status/{job_id}")).status == 404


TOKENS = [{"token": "alice-dev", "tenant": "alice", "role": "developer"},
          {"token": "alice-user", "tenant": "alice", "role": "user"},
          {"token": "bob-dev", "tenant": "bob", "role": "developer"},
          {"token": "root-admin", "tenant": "default", "role": "admin"}]


async def test_tenants_never_see_each_others_jobs(make_client, deploy_dir):
    from tests.support.servers import test_config

    config = test_config(deploy_dir(fn("alice-fn", "job_fns.echo", tenant="alice")), **{"auth.tokens": TOKENS})
    client = await make_client(config=config)
    alice = {"Authorization": "Bearer alice-user"}
    bob = {"Authorization": "Bearer bob-dev"}
    assert (await client.post("/v2/alice-fn/run", json={"input": {}})).status == 401
    job_id = (await (await client.post("/v2/alice-fn/runsync", json={"input": {}}, headers=alice)).json())["id"]
    assert (await client.get(f"/v2/alice-fn/status/{job_id}", headers=alice)).status == 200
    assert (await client.get(f"/serverless/v1/jobs/{job_id}", headers=alice)).status == 200
    assert (await client.post("/v2/alice-fn/run", json={"input": {}}, headers=bob)).status == 404  # not bob's: unknown
    assert (await client.get(f"/serverless/v1/jobs/{job_id}", headers=bob)).status == 404
    assert (await client.get(f"/serverless/v1/jobs/{job_id}/events", headers=bob)).status == 404
    assert (await client.delete(f"/serverless/v1/jobs/{job_id}", headers=bob)).status == 404
    assert (await client.get(f"/serverless/v1/functions/async-results/{job_id}", headers=bob)).status == 404
    assert (await (await client.get("/serverless/v1/jobs", headers=bob)).json())["jobs"] == []
    resp = await client.post(INVOKE.format("alice-fn"), json={}, headers={**bob, "X-Invoke-Type": "async"})
    assert resp.status == 404


async def test_a_queued_job_runs_only_as_the_tenant_it_was_submitted_for(make_client, deploy_dir):
    """The job runner dispatches as the job's tenant: another tenant's function of the same name
    (names are per tenant) does not take the first tenant's queued job; it runs on its own tenant's."""
    from tests.support.servers import test_config

    spec = fn("shared-name", "job_fns.sleeper", tenant="alice", concurrency=1)
    config = test_config(deploy_dir(spec), **{"auth.tokens": TOKENS})
    client = await make_client(config=config)
    alice = {"Authorization": "Bearer alice-user"}
    running = (await (await client.post("/v2/shared-name/run", json={"input": {"seconds": 0.5}},
                                        headers=alice)).json())["id"]
    queued = (await (await client.post("/v2/shared-name/run", json={"input": {"seconds": 0}},
                                       headers=alice)).json())["id"]
    resp = await client.put("/admin/v1/functions/shared-name", json={**spec, "tenant": "bob"},
                            headers={"Authorization": "Bearer root-admin"})
    assert resp.status == 404, await resp.text()  # bob has no `shared-name` to redeploy
    resp = await client.post("/admin/v1/functions", json={**spec, "tenant": "bob"},
                             headers={"Authorization": "Bearer root-admin"})
    assert resp.status == 201, await resp.text()  # bob's own, beside alice's
    for _ in range(100):
        state = await (await client.get(f"/serverless/v1/jobs/{queued}", headers=alice)).json()
        if state["status"] not in ("IN_QUEUE", "IN_PROGRESS"):
            break
        await asyncio.sleep(0.05)
    assert state["status"] == "COMPLETED", state
    first = await (await client.get(f"/serverless/v1/jobs/{running}", headers=alice)).json()
    assert first["status"] in ("IN_PROGRESS", "COMPLETED")  # it had started on alice's deployment
