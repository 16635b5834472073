"""Runaway `def` handlers are contained: a per-function thread bound, no start after the deadline,
the timeout answered at the deadline, overrunning threads flagged; loop stalls are reported."""
from __future__ import annotations

import asyncio
import json
import logging
import signal

import aiohttp
import pytest

from frontend.keys import EXECUTOR
from tests.support.servers import FUNCTIONS, HANDLERS, fn, test_config
from tests.support.waiting import eventually

INVOKE = "/serverless/v1/functions/{}/invocations"


def echo_fn() -> dict:
    return {"name": "other", "handler": "echo.handler", "codePath": str(FUNCTIONS), "timeout": 5}


async def status_of(client, name: str) -> dict:
    return (await (await client.get(f"/admin/v1/functions/{name}")).json())["function"]["status"]


async def test_a_spinning_function_cannot_take_the_shared_pool(make_client, deploy_dir):
    deploy = deploy_dir(fn("spin", "runaway_fns.spin", timeout=0.5), echo_fn())
    client = await make_client(test_config(deploy, **{"runtime.threadPoolSize": 8,
                                                       "runtime.threadsPerFunction": 2}))
    calls = [client.post(INVOKE.format("spin"), json={}) for _ in range(12)]
    spinning = asyncio.gather(*calls)
    await asyncio.sleep(0.2)
    # the other `def` function still gets threads while spin holds all it may
    for i in range(5):
        resp = await client.post(INVOKE.format("other"), json={"i": i})
        assert resp.status == 200 and await resp.json() == {"i": i}
    answers = await spinning
    assert [r.status for r in answers] == [504] * 12
    st = await status_of(client, "spin")
    assert st["inflight"] == 0                                    # the answer went out; the slot is free
    # Two ran past their timeout (more when a waiter, arriving later, got a stopped one's thread in time)
    assert st["threads"]["overranTotal"] >= 2 and st["threads"]["limit"] == 2
    await threads_end(client, "spin")                             # and the overrunning threads were stopped


async def threads_end(client, name: str) -> None:
    async def busy() -> int:
        return int((await status_of(client, name))["threads"]["busy"])
    await eventually(busy, f"the threads of {name} to end", accept=lambda n: n == 0)


async def test_a_thread_spinning_past_its_timeout_is_stopped(make_client, deploy_dir, tmp_path):
    deploy = deploy_dir(fn("burn", "runaway_fns.burn", timeout=0.3), fn("swallow", "runaway_fns.swallow", timeout=0.3),
                        echo_fn())
    client = await make_client(test_config(deploy, **{"runtime.threadsPerFunction": 2}))
    answers = await asyncio.gather(*(client.post(INVOKE.format("burn"), json={}) for _ in range(2)))
    assert [r.status for r in answers] == [504, 504]
    await threads_end(client, "burn")  # pure Python on a CPU, stopped where it spun
    for i in range(20):  # the threads that ran it serve other calls, untouched
        resp = await client.post(INVOKE.format("other"), json={"i": i})
        assert resp.status == 200 and await resp.json() == {"i": i}
    mark = tmp_path / "caught"
    resp = await client.post(INVOKE.format("swallow"), json={"mark": str(mark)})
    assert resp.status == 504
    await threads_end(client, "swallow")  # a handler that swallows the stop is stopped again
    assert mark.read_text() == "2"


async def test_a_call_whose_deadline_passed_while_waiting_never_starts(make_client, deploy_dir, tmp_path, caplog):
    deploy = deploy_dir(fn("record", "runaway_fns.record", timeout=0.5))
    client = await make_client(test_config(deploy, **{"runtime.threadsPerFunction": 1}))
    first, second = tmp_path / "first", tmp_path / "second"
    with caplog.at_level(logging.WARNING, logger="fnstream.runtime"):
        answers = await asyncio.gather(
            client.post(INVOKE.format("record"), json={"mark": str(first), "sleep": 1.2}),
            client.post(INVOKE.format("record"), json={"mark": str(second)}))
        assert [r.status for r in answers] == [504, 504]
        for _ in range(100):  # until the first thread really ended and freed the function's thread
            if (await status_of(client, "record"))["threads"]["busy"] == 0:
                break
            await asyncio.sleep(0.05)
    assert first.exists() and not second.exists()                # no side effect after its failure
    assert "use 'executor: process'" in caplog.text
    resp = await client.post(INVOKE.format("record"), json={"mark": str(second)})
    assert resp.status == 200 and second.exists()                # the function works again


@pytest.mark.allow_blocking  # the handler stalls the loop on purpose
async def test_loop_stalls_are_logged_with_the_function_and_counted(make_client, deploy_dir, caplog):
    deploy = deploy_dir(fn("blocker", "runaway_fns.blocks_loop", timeout=10))
    client = await make_client(test_config(deploy))
    monitor = client.app[EXECUTOR].loop_monitor
    with caplog.at_level(logging.WARNING, logger="fnstream.runtime"):
        resp = await client.post(INVOKE.format("blocker"), json={"sleep": 1.5})
        assert resp.status == 200
        # The monitor's next tick notices; on a loaded host that tick may come late. 1.5 s of sleep
        # (no CPU wanted) keeps it the loop's own stall even if the thread then waits for a CPU.
        await eventually(lambda: monitor.stalls + monitor.host_stalls, "the monitor's tick")
    assert monitor.stalls >= 1 and monitor.max_lag >= 1.2, monitor.describe()
    assert "event loop stalled" in caplog.text and "blocker" in caplog.text


async def test_memory_on_an_in_process_function_warns_at_deploy(make_client, deploy_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="fnstream.runtime"):
        await make_client(test_config(deploy_dir(fn("big", "runaway_fns.record", memory=256))))
    assert "'memory: 256' is not enforced" in caplog.text and "executor: process" in caplog.text


async def test_a_restored_function_warns_of_memory_only_when_it_was_set(make_client, tmp_path, caplog):
    """The stored deployment keeps what the deployer set: a default `memory` is no choice to warn of."""
    config = test_config(**{"jobs.path": str(tmp_path / "jobs.sqlite3")})
    client = await make_client(config)
    for spec in (fn("plain", "runaway_fns.record"), fn("sized", "runaway_fns.record", memory=256)):
        resp = await client.post("/admin/v1/functions", json=spec)
        assert resp.status == 201, await resp.text()
    await client.close()
    with caplog.at_level(logging.WARNING, logger="fnstream.runtime"):
        client = await make_client(config)  # restores both from the store
        assert (await client.post(INVOKE.format("plain"), json={"mark": str(tmp_path / "m")})).status == 200
    assert "function sized: 'memory: 256' is not enforced" in caplog.text
    assert "function plain:" not in caplog.text


async def test_sigterm_exits_after_the_grace_with_a_stuck_thread(start_server, deploy_dir):
    deploy = deploy_dir(fn("spin", "runaway_fns.stuck", timeout=1))
    server = start_server("--deploy-dir", str(deploy), "-s", "frontend.args.shutdownGraceSeconds=1",
                          "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}")
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + INVOKE.format("spin"), json={}) as r:
            assert r.status == 504
    server.proc.send_signal(signal.SIGTERM)
    rc = await asyncio.to_thread(server.proc.wait, 20)  # it used to never exit (only SIGKILL)
    assert rc == 1
    assert "abandoned" in server.output()


async def test_sigterm_exits_0_when_nothing_was_abandoned(server):
    server.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(server.proc.wait, 20) == 0
