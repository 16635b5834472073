"""`runtime.maxWorkerProcesses` is a hard cap on the worker processes a node runs (issue 24 F3, F8):
no deploy, scale-out or cold start goes past it, and exclusive sessions are judged against the
instances a function can really have under it."""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.servers import PROCESS_FUNCTIONS as PROC
from tests.support.waiting import eventually

FUNCS = "/admin/v1/functions"


@pytest.fixture
def capped(make_client):
    async def make(cap: int):
        return await make_client(**{"runtime.codeRoots": [str(PROC)], "runtime.deployDir": None,
                                    "runtime.maxWorkerProcesses": cap})
    return make


async def deploy(client, name: str, handler: str = "chunked_sleep", expect: int = 201, **fields) -> dict:
    manifest = {"name": name, "handler": f"shared.{handler}", "codePath": ".", "executor": "process",
                "scaleDownIdleSeconds": 600, **fields}
    resp = await client.post(FUNCS, data=json.dumps(manifest))
    body = await resp.json()
    assert resp.status == expect, body
    return body


async def workers(client) -> int:
    """Worker processes of every function on the node now (starting and stopping ones too)."""
    listed = await (await client.get(FUNCS)).json()
    total = 0
    for fn in listed["functions"]:
        body = await (await client.get(f"{FUNCS}/{fn['name']}")).json()
        pool = body["function"]["status"].get("pool")
        total += len(pool["workers"]) if pool else 0
    return total


def invoke(client, name: str, event: dict, headers: dict | None = None):
    return client.post(f"/serverless/v1/functions/{name}/invocations", json=event, headers=headers or {})


async def test_a_deploy_needing_a_worker_past_the_cap_is_refused(capped):
    # The minimums fill the node (1 + 3 of 4): a scale-to-zero function would need a 5th worker to
    # import its code, and could never run a call: refused, nothing left running.
    client = await capped(4)
    await deploy(client, "pe", instances=1)
    await deploy(client, "pf", minInstances=3)
    body = await deploy(client, "pe2", expect=429, minInstances=0, maxInstances=2, timeout=5)
    assert "runtime.maxWorkerProcesses" in body["message"]
    assert (await client.get(f"{FUNCS}/pe2")).status == 404
    assert await workers(client) == 4


async def test_a_deploy_is_refused_while_other_functions_scaled_out_fill_the_node(capped):
    # px keeps none but scaled out to the whole node (2): py's 2 kept workers would make 4.
    client = await capped(2)
    await deploy(client, "px", minInstances=0, maxInstances=2, instanceConcurrency=1, timeout=60)
    calls = [asyncio.ensure_future(invoke(client, "px", {"seconds": 30})) for _ in range(2)]
    try:
        await eventually(lambda: workers(client), "px scaled out to 2", accept=lambda n: n == 2)
        body = await deploy(client, "py", expect=429, instances=2)
        assert "runtime.maxWorkerProcesses" in body["message"]
        assert await workers(client) == 2
    finally:
        for call in calls:
            call.cancel()


async def test_a_function_filling_the_node_can_be_redeployed_and_replaced(capped):
    # The new code's workers start while the replaced ones still run (the one overlap), and a
    # function deleted makes room for the next deploy once its workers exit.
    client = await capped(2)
    await deploy(client, "pz", instances=2)
    manifest = {"name": "pz", "handler": "shared.nap", "codePath": ".", "executor": "process", "instances": 2}
    resp = await client.put(f"{FUNCS}/pz", data=json.dumps(manifest))
    assert resp.status == 200, await resp.text()
    assert (await client.delete(f"{FUNCS}/pz")).status == 200
    await deploy(client, "pz2", instances=2)
    await eventually(lambda: workers(client), "only pz2's workers", accept=lambda n: n == 2)


def exclusive(sid: str) -> dict:
    return {"X-Instance-Session": json.dumps({"sessionID": sid, "sessionTTL": 86400, "concurrency": -1})}


async def sessions(client, name: str) -> list:
    return (await (await client.get(f"{FUNCS}/{name}")).json())["function"]["status"]["sessions"]


async def test_an_exclusive_session_is_judged_against_the_instances_the_cap_allows(capped):
    # pe2 may have 2 instances, but the node (2) has room for one: exclusive use of it would
    # leave every other caller waiting for the session's day-long TTL. Refused, and others run.
    client = await capped(2)
    await deploy(client, "pe", instances=1)
    await deploy(client, "pe2", minInstances=0, maxInstances=2, timeout=5)
    resp = await invoke(client, "pe2", {"seconds": 0}, exclusive("e1"))
    body = await resp.json()
    assert resp.status == 429 and body["code"] == 200429, body
    assert "runtime.maxWorkerProcesses" in body["message"]
    assert await sessions(client, "pe2") == []
    assert (await invoke(client, "pe2", {"seconds": 0})).status == 200


async def test_an_exclusive_session_shares_its_worker_once_the_cap_leaves_no_other(capped):
    # e1 took one of 2 instances pe2 could have; then another deploy took the node's last room:
    # pe2 can have no other worker, so e1 shares its own rather than starve the others.
    client = await capped(2)
    await deploy(client, "pe2", minInstances=0, maxInstances=2, timeout=5)
    resp = await invoke(client, "pe2", {"seconds": 0}, exclusive("e1"))
    assert resp.status == 200, await resp.text()
    owner = (await resp.json())["pid"]
    await deploy(client, "fb", "nap", minInstances=1)
    resp = await invoke(client, "pe2", {"seconds": 0})
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["pid"] == owner
    pool = (await (await client.get(f"{FUNCS}/pe2")).json())["function"]["status"]["pool"]
    assert pool["exclusiveLost"] == 1 and len(pool["workers"]) == 1
    resp = await invoke(client, "pe2", {"seconds": 0}, exclusive("e1"))
    assert resp.status == 200 and (await resp.json())["pid"] == owner  # the session keeps its worker


async def test_idle_scale_outs_give_way_to_a_deploy(capped):
    # pa scaled out to the room nobody holds (pb holds 1 of 3 for its cold start) and went idle,
    # with a long scaleDownIdleSeconds: pb's cold start takes the slot it holds, and pc's deploy
    # gets a worker of pa's back instead of waiting for it.
    client = await capped(3)
    await deploy(client, "pb", "nap", minInstances=0, maxInstances=1, scaleDownIdleSeconds=0.2, timeout=20)
    await eventually(lambda: workers(client), "pb scaled to zero", accept=lambda n: n == 0)
    await deploy(client, "pa", minInstances=0, maxInstances=3, instanceConcurrency=1, timeout=60)
    gate = [asyncio.ensure_future(invoke(client, "pa", {"seconds": 1})) for _ in range(3)]
    await eventually(lambda: workers(client), "pa scaled out to 2", accept=lambda n: n == 2)
    resp = await invoke(client, "pb", {"seconds": 0})  # its held slot: no wait for pa
    assert resp.status == 200, await resp.text()
    assert [r.status for r in await asyncio.gather(*gate)] == [200] * 3
    await deploy(client, "pc", "nap", instances=1)
    assert await workers(client) <= 3


async def test_a_scale_to_zero_function_keeps_its_slot_for_its_cold_start(capped):
    # Issue 24 B/C(i): lazy holds one of 2 from its deploy on, though it runs no worker: another
    # function's minimums cannot take it (w2 is refused), and lazy's call is answered.
    client = await capped(2)
    await deploy(client, "lazy", "nap", minInstances=0, maxInstances=1, scaleDownIdleSeconds=0.2, timeout=20)
    await eventually(lambda: workers(client), "lazy scaled to zero", accept=lambda n: n == 0)
    await deploy(client, "w1", "nap", minInstances=1)
    body = await deploy(client, "w2", "nap", expect=429, minInstances=1, timeout=5)
    assert "runtime.maxWorkerProcesses" in body["message"]
    resp = await invoke(client, "lazy", {"seconds": 0})
    assert resp.status == 200, await resp.text()


async def test_a_backlog_scaled_out_leaves_another_functions_call_its_slot(capped):
    # Issue 24 C(ii): tb's backlog scales out over every worker it may have; `one` (scale to zero)
    # is answered while that backlog still runs, not once it drained.
    client = await capped(3)
    await deploy(client, "slow", minInstances=0, maxInstances=20, instanceConcurrency=1, timeout=120)
    await deploy(client, "one", "nap", minInstances=0, maxInstances=1, scaleDownIdleSeconds=0.2, timeout=120)
    await eventually(lambda: workers(client), "one scaled to zero", accept=lambda n: n == 1)
    calls = [asyncio.ensure_future(invoke(client, "slow", {"seconds": 1})) for _ in range(16)]
    try:
        seen: list[bool] = []

        async def scaled_out() -> bool:
            # as far as the node lets it: every worker busy, calls waiting, none starting (twice running)
            pool = (await (await client.get(f"{FUNCS}/slow")).json())["function"]["status"]["pool"]
            seen.append(pool["waiting"] > 0 and len(pool["workers"]) >= 2
                        and all(w["state"] == "busy" for w in pool["workers"]))
            return seen[-2:] == [True, True]
        await eventually(scaled_out, "slow scaled out as far as it may")
        resp = await invoke(client, "one", {"seconds": 0})
        assert resp.status == 200, await resp.text()
        # slow's backlog still waited: more calls undone than the node could run at once
        assert len(calls) - sum(c.done() for c in calls) > 3
        assert [r.status for r in await asyncio.gather(*calls)] == [200] * len(calls)
    finally:
        for call in calls:
            call.cancel()


async def test_busy_scale_outs_give_way_to_a_deploy(capped):
    # slow scaled out over the whole node (3) with a backlog that keeps every worker busy past a
    # deploy's wait for room: a worker above slow's hold exits after its call, and pc fits.
    client = await capped(3)
    await deploy(client, "slow", minInstances=0, maxInstances=3, instanceConcurrency=1, timeout=120)
    calls = [asyncio.ensure_future(invoke(client, "slow", {"seconds": 0.5})) for _ in range(60)]
    try:
        await eventually(lambda: workers(client), "slow scaled out to 3", accept=lambda n: n == 3)
        await deploy(client, "pc", "nap", instances=1)
        assert sum(c.done() for c in calls) < len(calls)  # the backlog still ran
        assert [r.status for r in await asyncio.gather(*calls)] == [200] * len(calls)
    finally:
        for call in calls:
            call.cancel()
