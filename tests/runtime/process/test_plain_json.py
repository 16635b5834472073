"""A plain JSON call of a process function runs in its request's task (Executor.start's `inline`,
ProcessExecutor.defer): no task of its own, and still the same cancel, abort and slot rules."""
from __future__ import annotations

import asyncio

import pytest

from frontend.keys import EXECUTOR, REGISTRY
from tests.runtime.process.test_process import PROC, call_ok, deploy, pool_status, wait_ready, wait_until
from tests.support.servers import FUNCTIONS

INVOKE = "/serverless/v1/functions/{}/invocations"


@pytest.fixture
async def pclient(make_client):
    return await make_client(**{"runtime.codeRoots": [str(PROC), str(FUNCTIONS)], "runtime.deployDir": None})


def _invocation_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("invocation-")]


async def test_a_json_call_has_no_task_and_a_disconnect_interrupts_its_handler(pclient, tmp_path):
    await deploy(pclient, "pj-cancel", "until_cancelled")
    (pid,) = await wait_ready(pclient, "pj-cancel")
    dep = pclient.app[REGISTRY].get("pj-cancel")
    marker = tmp_path / "cancelled"
    call = asyncio.ensure_future(pclient.post(INVOKE.format("pj-cancel"), json={"marker": str(marker)}))
    await wait_until(lambda: _true(dep.inflight == 1), "the call to run")
    assert _invocation_tasks() == []  # it runs in the request's task (a streaming call has one)
    call.cancel()  # the client goes away mid-call

    async def interrupted() -> bool:
        return marker.exists() and marker.read_text() != ""
    await wait_until(interrupted, "the handler to be interrupted")
    assert marker.read_text() == str(pid)  # interrupted in place, its worker kept
    await wait_until(lambda: _true(dep.inflight == 0), "the concurrency slot back")
    marker.unlink()
    assert await call_ok(pclient, "pj-cancel", {"marker": str(marker), "limit": 2}) == 2
    pool = await pool_status(pclient, "pj-cancel")
    assert pool["restarts"] == 0 and pool["workers"][0]["pid"] == pid


async def test_a_json_call_aborted_by_shutdown_answers_the_shutdown(pclient, tmp_path):
    await deploy(pclient, "pj-abort", "sleeper", timeout=600)
    await wait_ready(pclient, "pj-abort")
    dep = pclient.app[REGISTRY].get("pj-abort")
    call = asyncio.ensure_future(pclient.post(INVOKE.format("pj-abort"), json={"seconds": 30}))
    await wait_until(lambda: _true(dep.inflight == 1), "the call to run")
    assert await pclient.app[EXECUTOR].drain(0) == 1
    resp = await call
    body = await resp.json()
    assert resp.status == 503 and body["code"] == 200503 and "shutting down" in body["message"], body
    assert resp.headers["X-Invocation-Id"]
    await wait_until(lambda: _true(dep.inflight == 0), "the concurrency slot back")
    assert not pclient.app[EXECUTOR].active


async def _true(value: bool) -> bool:
    return value
