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
    return test_config(deploy_dir(*functions), **{"auth.tokens": TOKENS, **overrides})


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
