"""Tenants share the `def` thread pool fairly: a tenant flooding slow `def` handlers over several
functions holds at most `runtime.threadsPerTenant` threads, and another tenant's `def` calls are
served meanwhile; threads that free go to waiting tenants in turn (runtime/limits.py TenantShares)."""
from __future__ import annotations

import asyncio

from frontend.keys import EXECUTOR
from runtime.limits import TenantShares
from tests.support.servers import FUNCTIONS, fn, test_config
from tests.support.tenants import TOKENS, bearer
from tests.support.waiting import eventually

INVOKE = "/serverless/v1/functions/{}/invocations"


async def test_a_tenant_flooding_slow_def_handlers_leaves_the_others_threads(make_client, deploy_dir, tmp_path):
    marks, release = tmp_path / "marks", tmp_path / "release"
    marks.mkdir()
    # Tenant A (acme): four functions of two threads each would hold the whole pool of 8 threads.
    deploy = deploy_dir(*(fn(f"a{i}", "runaway_fns.holds", tenant="acme", timeout=120) for i in range(4)),
                        {"name": "b-echo", "handler": "echo.handler", "codePath": str(FUNCTIONS), "timeout": 120})
    # runtime.threadsPerTenant unset: half the pool, 4 threads.
    client = await make_client(test_config(deploy, **{"auth.tokens": TOKENS, "runtime.threadPoolSize": 8,
                                                       "runtime.threadsPerFunction": 2}))

    async def call(name: str, token: str, body: dict) -> tuple[int, object]:
        resp = await client.post(INVOKE.format(name), json=body, headers=bearer(token))
        return resp.status, await resp.json()

    hold = {"marks": str(marks), "release": str(release)}
    flood = [asyncio.create_task(call(f"a{i % 4}", "user-a", hold)) for i in range(16)]
    await eventually(lambda: len(list(marks.iterdir())), "tenant A's share of threads taken",
                     accept=lambda n: n == 4)
    for i in range(5):  # B's `def` calls get threads while A's sixteen calls still wait or hold theirs
        served = asyncio.create_task(call("b-echo", "user-b", {"i": i}))
        await eventually(served.done, "tenant B's call answered while tenant A saturates its share")
        assert served.result() == (200, {"i": i})
    assert not any(t.done() for t in flood) and len(list(marks.iterdir())) == 4  # A held only its share
    release.touch()
    answers = await asyncio.gather(*flood)
    assert answers == [(200, "released")] * 16
    assert len(list(marks.iterdir())) == 16


async def test_freed_threads_go_to_waiting_tenants_in_turn():
    shares = TenantShares(threads=2, per_tenant=2)
    assert shares.try_acquire("a") and shares.try_acquire("a")
    assert not shares.try_acquire("b")                     # the pool is full
    order: list[str] = []

    async def wait(tenant: str) -> None:
        await shares.acquire(tenant)
        order.append(tenant)

    waiters = [asyncio.create_task(wait(t)) for t in ("a", "a", "a", "b", "c")]
    await asyncio.sleep(0)  # every waiter queued
    cancelled = waiters[1]
    cancelled.cancel()          # a waiter that leaves gives up its place, not a thread
    await asyncio.gather(cancelled, return_exceptions=True)
    for _ in range(4):
        holder = order[-1] if order else "a"
        shares.release(holder)
        await asyncio.sleep(0)
    assert order == ["a", "b", "c", "a"]                    # one each in turn, not A's three first
    assert shares.busy == 2 and not any(shares.waiting(t) for t in "abc")
    shares.release("a")
    shares.release("a")
    assert shares.busy == 0 and not any(shares.held.values())


async def test_a_tenant_at_its_share_waits_while_another_gets_the_free_thread():
    shares = TenantShares(threads=3, per_tenant=2)
    assert shares.try_acquire("a") and shares.try_acquire("a")
    assert not shares.try_acquire("a")                      # at its share, with a thread free
    a_waits = asyncio.create_task(shares.acquire("a"))
    await asyncio.sleep(0)
    assert shares.try_acquire("b")                          # the free thread is B's to take
    assert not a_waits.done()
    shares.release("b")                                     # a free thread, but A is still at its share
    await asyncio.sleep(0)
    assert not a_waits.done()
    shares.release("a")
    await asyncio.sleep(0)
    assert a_waits.done() and shares.held["a"] == 2


async def test_the_configured_share_is_the_executors(make_client):
    client = await make_client(test_config(**{"runtime.threadPoolSize": 12, "runtime.threadsPerTenant": 5}))
    shares = client.app[EXECUTOR].shares
    assert (shares.threads, shares.per_tenant) == (12, 5)
