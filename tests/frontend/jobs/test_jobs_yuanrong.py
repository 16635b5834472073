"""openYuanrong async invocation: X-Invoke-Type: async → 202 {"requestId"}, async-results, webhooks."""
from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from frontend.jobs import WEBHOOKS

INVOKE = "/serverless/v1/functions/{}/invocations"
ASYNC = {"X-Invoke-Type": "async"}


async def result_of(client, request_id: str) -> dict:
    for _ in range(500):
        resp = await client.get(f"/serverless/v1/functions/async-results/{request_id}")
        assert resp.status == 200
        body = await resp.json()
        if body["status"] not in ("pending", "running"):
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(body)


async def test_async_invoke_on_both_routes(jobs):
    resp = await jobs.post(INVOKE.format("writer"), json={"n": 2}, headers=ASYNC)
    assert resp.status == 202
    request_id = (await resp.json())["requestId"]
    assert resp.headers["X-Async-Request-Id"] == request_id
    body = await result_of(jobs, request_id)
    assert body == {"requestId": request_id, "status": "completed", "statusCode": 200,
                    "respBody": {"ok": True, "got": {"n": 2}}}
    resp = await jobs.post("/invocations/default/default/writer/", json={"n": 1}, headers=ASYNC)
    assert resp.status == 202
    assert (await result_of(jobs, (await resp.json())["requestId"]))["status"] == "completed"


async def test_async_states_and_failure(jobs):
    resp = await jobs.post(INVOKE.format("sync-sleeper"), json={"input": {"seconds": 0.4}}, headers=ASYNC)
    request_id = (await resp.json())["requestId"]
    states = set()
    while True:
        body = await (await jobs.get(f"/serverless/v1/functions/async-results/{request_id}")).json()
        states.add(body["status"])
        if body["status"] == "completed":
            break
        await asyncio.sleep(0.02)
    assert "running" in states and body["respBody"] == "slept"
    resp = await jobs.post(INVOKE.format("raises"), json={}, headers=ASYNC)
    body = await result_of(jobs, (await resp.json())["requestId"])
    assert body["status"] == "failed" and body["statusCode"] == 500
    assert body["respBody"]["code"] == 4001 and "no widgets" in body["respBody"]["message"]


async def test_unknown_request_id_is_404(jobs):
    resp = await jobs.get("/serverless/v1/functions/async-results/nope")
    assert resp.status == 404
    body = await resp.json()
    assert body["code"] == 200404 and "not found" in body["message"]


@pytest.fixture
async def webhook_receiver():
    """A local aiohttp server that records webhook calls; answers 500 to the first `fail_first`."""
    calls: list[tuple[float, dict, dict]] = []
    state = {"fail_first": 1}

    async def hook(request: web.Request) -> web.Response:
        calls.append((time.monotonic(), dict(request.headers), await request.json()))
        if len(calls) <= state["fail_first"]:
            return web.Response(status=500, text="not yet")
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = TestServer(app)
    await server.start_server()
    yield server, calls, state
    await server.close()


@pytest.fixture
async def private_jobs(make_client, job_config):
    """The job server with webhooks allowed to reach loopback (the tests' receivers listen there)."""
    return await make_client(config=job_config(**{"jobs.webhook.allowPrivate": True}))


async def test_webhook_is_retried_after_a_500(private_jobs, webhook_receiver):
    jobs = private_jobs
    server, calls, _ = webhook_receiver
    url = str(server.make_url("/hook"))
    resp = await jobs.post(INVOKE.format("writer"), json={"n": 1}, headers={**ASYNC, "X-Webhook-Url": url})
    request_id = (await resp.json())["requestId"]
    for _ in range(300):
        if len(calls) >= 2:
            break
        await asyncio.sleep(0.02)
    assert len(calls) == 2, calls
    (t1, headers, body), (t2, _, body2) = calls
    assert body == body2 and t2 - t1 >= 0.9  # the retry waited ~1 s
    assert headers["X-Async-Request-Id"] == request_id and headers["Content-Type"].startswith("application/json")
    assert body["requestId"] == request_id and body["status"] == "completed" and body["statusCode"] == 200
    assert json.loads(base64.b64decode(body["result"])) == {"ok": True, "got": {"n": 1}}
    assert body["error"] == "" and body["completedAt"].endswith("Z")


async def test_runpod_webhook_gets_the_status_object(private_jobs, webhook_receiver):
    jobs = private_jobs
    server, calls, state = webhook_receiver
    state["fail_first"] = 0
    resp = await jobs.post("/v2/echo-job/run", json={"input": {"a": 1}, "webhook": str(server.make_url("/hook"))})
    job_id = (await resp.json())["id"]
    for _ in range(300):
        if calls:
            break
        await asyncio.sleep(0.02)
    body = calls[0][2]
    assert body["id"] == job_id and body["status"] == "COMPLETED" and body["output"]["input"] == {"a": 1}


async def test_webhook_allowed_hosts(make_client, job_config):
    client = await make_client(config=job_config(**{"jobs.webhook.allowedHosts": ["hooks.example.com"]}))
    resp = await client.post(INVOKE.format("writer"), json={},
                             headers={**ASYNC, "X-Webhook-Url": "http://169.254.169.254/latest"})
    assert resp.status == 400 and "allowedHosts" in (await resp.json())["message"]
    resp = await client.post("/v2/writer/run", json={"input": {}, "webhook": "ftp://hooks.example.com/x"})
    assert resp.status == 400 and "http(s)" in (await resp.json())["error"]
    resp = await client.post(INVOKE.format("writer"), json={},
                             headers={**ASYNC, "X-Webhook-Url": "https://hooks.example.com/x"})
    assert resp.status == 202


async def test_webhook_to_loopback_is_refused_by_default(jobs, webhook_receiver):
    """A literal loopback URL is refused at submit on both APIs; a name resolving to loopback is
    refused at delivery: the receiver never gets the POST."""
    server, calls, state = webhook_receiver
    state["fail_first"] = 0
    port = server.port
    for host in ("127.0.0.1", "[::ffff:127.0.0.1]", "0.0.0.0", "2130706433", "[::1]"):
        url = f"http://{host}:{port}/hook"
        resp = await jobs.post(INVOKE.format("writer"), json={}, headers={**ASYNC, "X-Webhook-Url": url})
        body = await resp.json()
        assert resp.status == 400 and "allowPrivate" in body["message"], (url, body)
        resp = await jobs.post("/v2/writer/run", json={"input": {}, "webhook": url})
        assert resp.status == 400 and "allowPrivate" in (await resp.json())["error"], url
    sender = jobs.server.app[WEBHOOKS]
    resp = await jobs.post(INVOKE.format("writer"), json={},
                           headers={**ASYNC, "X-Webhook-Url": f"http://localhost:{port}/hook"})
    assert resp.status == 202
    for _ in range(500):
        if sender.failed:
            break
        await asyncio.sleep(0.02)
    assert sender.failed == 1 and sender.delivered == 0 and calls == []


async def test_yr_imports_and_streams(jobs):
    resp = await jobs.post(INVOKE.format("uses-yr"), json={})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"received": ["hello-yr"], "shim": True}


async def test_the_yr_docs_example_runs(jobs):
    """docs/yr.md's handler, blocking forms and `from yr.stream import SubscriptionType`."""
    resp = await jobs.post(INVOKE.format("uses-yr-sync"), json={})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"data": "42", "consumers": 0}
