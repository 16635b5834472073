"""Issue 24: one tenant's token cannot exhaust the node's job limits for the other tenants."""
from __future__ import annotations

from tests.support.servers import fn, test_config

TOKENS = [{"token": "alice-user", "tenant": "alice", "role": "user"},
          {"token": "bob-user", "tenant": "bob", "role": "user"}]
ALICE = {"Authorization": "Bearer alice-user"}
BOB = {"Authorization": "Bearer bob-user"}


def two_tenants(deploy_dir, **overrides):
    functions = [fn("alice-sleep", "job_fns.sleeper", tenant="alice", concurrency=1),
                 fn("bob-sleep", "job_fns.sleeper", tenant="bob", concurrency=1)]
    # A short shutdown grace: the jobs left sleeping would otherwise hold the teardown 10 s.
    return test_config(deploy_dir(*functions), **{"auth.tokens": TOKENS, "frontend.args.shutdownGraceSeconds": 0.5,
                                                  **overrides})


async def test_one_tenants_backlog_does_not_refuse_another_tenants_jobs(make_client, deploy_dir):
    client = await make_client(config=two_tenants(deploy_dir, **{"jobs.maxQueued": 4,
                                                                 "jobs.maxQueuedPerTenant": 2}))
    statuses = [(await client.post("/v2/alice-sleep/run", json={"input": {"seconds": 30}}, headers=ALICE)).status
                for _ in range(4)]
    assert statuses.count(429) >= 1 and statuses.count(200) >= 2  # one may be running, not queued
    refused = await client.post("/v2/alice-sleep/run", json={"input": {"seconds": 30}}, headers=ALICE)
    assert refused.status == 429
    assert "jobs.maxQueuedPerTenant" in (await refused.json())["error"]
    for _ in range(2):  # bob's own share is untouched by alice's backlog
        resp = await client.post("/v2/bob-sleep/run", json={"input": {"seconds": 30}}, headers=BOB)
        assert resp.status == 200, await resp.text()
    resp = await client.post("/serverless/v1/functions/alice-sleep/invocations", json={},
                             headers={**ALICE, "X-Invoke-Type": "async"})
    assert resp.status == 429 and (await resp.json())["code"] == 200429
    for name, headers in (("alice-sleep", ALICE), ("bob-sleep", BOB)):
        assert (await client.post(f"/v2/{name}/purge-queue", headers=headers)).status == 200


async def test_input_size_and_tenant_quota_are_answered_at_submit(make_client, deploy_dir):
    config = two_tenants(deploy_dir, **{"jobs.maxInputBytes": 1000, "jobs.maxInputBytesSync": 2000,
                                        "jobs.tenantQuotaBytes": 5000})
    client = await make_client(config=config)
    mid = {"seconds": 0, "pad": "x" * 1500}
    resp = await client.post("/v2/alice-sleep/run", json={"input": mid}, headers=ALICE)
    assert resp.status == 413 and "jobs.maxInputBytes" in (await resp.json())["error"]
    resp = await client.post("/v2/alice-sleep/runsync", json={"input": mid}, headers=ALICE)
    assert resp.status == 200 and (await resp.json())["status"] == "COMPLETED"
    resp = await client.post("/v2/alice-sleep/runsync", json={"input": {"pad": "x" * 2500}}, headers=ALICE)
    assert resp.status == 413 and "jobs.maxInputBytesSync" in (await resp.json())["error"]
    # RunPod's limit is on the payload: a body over it is refused before it is parsed (this one is not JSON)
    resp = await client.post("/v2/alice-sleep/run", data=b'{"input": "' + b"x" * 1000 + b'", "n": NaN}', headers=ALICE)
    assert resp.status == 413 and "jobs.maxInputBytes" in (await resp.json())["error"]
    resp = await client.post("/serverless/v1/functions/alice-sleep/invocations", json=mid,
                             headers={**ALICE, "X-Invoke-Type": "async"})
    assert resp.status == 413 and (await resp.json())["code"] == 200413
    for _ in range(2):  # with the first, about 4.5 kB of alice's 5 kB kept
        resp = await client.post("/v2/alice-sleep/runsync", json={"input": mid}, headers=ALICE)
        assert resp.status == 200
    resp = await client.post("/v2/alice-sleep/runsync", json={"input": mid}, headers=ALICE)
    assert resp.status == 507 and "jobs.tenantQuotaBytes" in (await resp.json())["error"]
    resp = await client.post("/serverless/v1/functions/alice-sleep/invocations", json={"pad": "x" * 900},
                             headers={**ALICE, "X-Invoke-Type": "async"})
    assert resp.status == 507 and (await resp.json())["code"] == 200507
    resp = await client.post("/v2/bob-sleep/runsync", json={"input": mid}, headers=BOB)  # bob's quota is his own
    assert resp.status == 200 and (await resp.json())["status"] == "COMPLETED"


async def test_the_tenant_quota_counts_results_too(make_client, deploy_dir):
    # An echo's result is its input again: both are stored, both count (inputs alone let a tenant
    # store twice its quota).
    functions = [fn("alice-echo", "job_fns.echo", tenant="alice")]
    config = test_config(deploy_dir(*functions), **{"auth.tokens": TOKENS, "jobs.tenantQuotaBytes": 10_000})
    client = await make_client(config=config)
    pad = {"pad": "x" * 2000}
    statuses = [(await client.post("/v2/alice-echo/runsync", json={"input": pad}, headers=ALICE)).status
                for _ in range(4)]
    assert statuses[:2] == [200, 200] and statuses[-1] == 507, statuses  # ~4 kB a job: two fit in 10 kB


async def test_a_slow_receiver_of_one_tenant_never_drops_another_tenants_webhooks(make_client, deploy_dir):
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    release = asyncio.Event()
    got: list[str] = []

    async def receive(request):
        got.append(request.path)
        if request.path == "/slow":
            await release.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/{kind}", receive)
    receiver = TestServer(app, host="127.0.0.1")
    await receiver.start_server()
    try:
        config = two_tenants(deploy_dir, **{"jobs.webhook.allowPrivate": True, "jobs.webhook.queueSize": 3,
                                            "jobs.webhook.tenantQueueSize": 2, "jobs.webhook.attempts": 1})
        client = await make_client(config=config)
        for _ in range(3):
            resp = await client.post("/v2/alice-sleep/runsync", headers=ALICE, json={
                "input": {"seconds": 0}, "webhook": str(receiver.make_url("/slow"))})
            assert (await resp.json())["status"] == "COMPLETED"
        resp = await client.post("/v2/bob-sleep/runsync", headers=BOB, json={
            "input": {"seconds": 0}, "webhook": str(receiver.make_url("/fast"))})
        assert (await resp.json())["status"] == "COMPLETED"
        for _ in range(250):
            if "/fast" in got:
                break
            await asyncio.sleep(0.02)
        assert "/fast" in got  # bob's webhook went out while alice's two (her share) still hang
        assert got.count("/slow") == 2
    finally:
        release.set()
        await receiver.close()
