"""How invocations end when something other than the handler's return ends them: the handler's
own CancelledError, a shutdown drain with no grace, the deadline with events still buffered."""
from __future__ import annotations

import asyncio

import pytest

from frontend.keys import EXECUTOR, REGISTRY
from tests.support.servers import fn, test_config

SSE = {"Accept": "text/event-stream"}


def _url(name: str) -> str:
    return f"/serverless/v1/functions/{name}/invocations"


@pytest.mark.parametrize("headers,event", [({}, {}), (SSE, {}), (SSE, {"write": True})],
                         ids=["json", "sse-before-events", "sse-mid-stream"])
async def test_handler_own_cancelled_error_is_a_handler_error(make_client, deploy_dir, headers, event):
    """Awaiting a future someone else cancelled raises CancelledError in the handler. That is the
    handler failing (500 / 4001, or an error event and [DONE]), not the client leaving: the
    connection used to be dropped with no response (ServerDisconnectedError / truncated chunks)."""
    d = deploy_dir(fn("rc", "review_fns.raises_cancelled"))
    client = await make_client(test_config(d))
    resp = await asyncio.wait_for(client.post(_url("rc"), headers=headers, json=event), 5)
    body = await resp.read()
    if event.get("write"):
        assert resp.status == 200
        assert b'"code":4001' in body.replace(b" ", b"") and body.endswith(b"data: [DONE]\n\n"), body
    else:
        assert resp.status == 500, body
        assert b"4001" in body and b"CancelledError" in body
    assert client.server.app[REGISTRY].get("rc").inflight == 0


async def test_drain_with_zero_grace_aborts_at_once(make_client, deploy_dir):
    """`asyncio.wait(..., timeout=grace or None)` turned a grace of 0 into "wait forever": SIGTERM
    with shutdownGraceSeconds 0 hung until every handler ended instead of aborting them."""
    d = deploy_dir(fn("slow", "review_fns.async_slow"))
    client = await make_client(test_config(d, **{"frontend.args.shutdownGraceSeconds": 0}))
    req = asyncio.ensure_future(client.post(_url("slow"), headers=SSE, json={"sleep": 30}))
    try:
        for _ in range(100):
            if client.server.app[EXECUTOR].active:
                break
            await asyncio.sleep(0.01)
        aborted = await asyncio.wait_for(client.server.app[EXECUTOR].drain(0), 3)
        assert aborted == 1
        resp = await asyncio.wait_for(req, 5)
        body = await resp.read()
        assert b"200503" in body and body.endswith(b"data: [DONE]\n\n")
    finally:
        req.cancel()


async def test_drain_aborts_a_plain_json_call_running_in_the_request_task(make_client, deploy_dir):
    """A plain JSON call runs in its request's own task (no task of its own): the shutdown's abort
    cancels that task, and the call must answer the abort (503, 200503), not end as a cancel."""
    d = deploy_dir(fn("slow", "review_fns.async_slow"))
    client = await make_client(test_config(d, **{"frontend.args.shutdownGraceSeconds": 0}))
    req = asyncio.ensure_future(client.post(_url("slow"), json={"sleep": 30}))
    try:
        for _ in range(100):
            if client.server.app[EXECUTOR].active:
                break
            await asyncio.sleep(0.01)
        assert await asyncio.wait_for(client.server.app[EXECUTOR].drain(0), 3) == 1
        resp = await asyncio.wait_for(req, 5)
        body = await resp.json()
        assert (resp.status, body["code"], resp.headers["X-Inner-Code"]) == (503, 200503, "200503"), body
        assert client.server.app[REGISTRY].get("slow").inflight == 0
    finally:
        req.cancel()


async def test_an_inline_call_timed_out_then_aborted_in_one_tick_answers_the_timeout(deploy_dir):
    """The deadline and a shutdown's abort land in the same loop turn: a call in a task of its own
    answers 504 (its run raises the timeout first); one running in the request's task must too."""
    from runtime.dispatch import Dispatcher, InvokeOptions
    from runtime.errors import FunctionTimeoutError, ServiceUnavailableError
    from runtime.executor import Executor
    from runtime.manifest import load_deploy_dir
    from runtime.registry import Registry
    from tests.support.servers import HANDLERS

    d = deploy_dir(fn("slow", "review_fns.async_slow", timeout=1))
    registry = Registry([HANDLERS])
    await asyncio.to_thread(lambda: registry.deploy(load_deploy_dir(d)))  # imports: off the loop
    executor = Executor(2)
    try:
        inv = await Dispatcher(registry, executor).dispatch(None, "slow", {"sleep": 30}, InvokeOptions(inline=True))
        call = asyncio.ensure_future(inv.encoded_result())
        await asyncio.sleep(0.05)
        inv.time_out("function 'slow' timed out after 1 s")
        inv.abort(ServiceUnavailableError("the server is shutting down"))
        with pytest.raises(FunctionTimeoutError):
            await call
        assert registry.get("slow").failures == 1 and registry.get("slow").inflight == 0
    finally:
        await registry.stop_workers()
        executor.shutdown()


async def test_timeout_keeps_events_written_before_the_deadline(deploy_dir):
    """A slow client has events waiting in the invocation's buffer when the deadline passes. The
    timeout used channel.cancel(), which empties the buffer: those events (written in time) were
    never sent, and the client got the 504 error alone. Expected: what was written, then the error."""
    from runtime.errors import FunctionTimeoutError
    from runtime.executor import Executor
    from runtime.invocation import Invocation
    from runtime.manifest import load_deploy_dir
    from runtime.registry import Registry
    from tests.support.servers import HANDLERS

    d = deploy_dir(fn("burst", "review_fns.sync_burst_then_sleep", timeout=0.3))
    registry = Registry([HANDLERS])
    [dep] = await asyncio.to_thread(lambda: registry.deploy(load_deploy_dir(d)))  # imports: off the loop
    executor = Executor(2)
    try:
        inv = Invocation(dep, {"n": 5, "sleep": 1}, mode="sse", loop=asyncio.get_running_loop(), buffer_events=10)
        executor.start(inv)
        await asyncio.sleep(0.6)  # the reader (a slow client) reads nothing before the deadline
        assert inv.timed_out is not None
        got = []
        while batch := await asyncio.wait_for(inv.channel.get_batch(), 2):
            got.extend(batch)
        assert got == [f"e{i}" for i in range(5)]
        with pytest.raises(FunctionTimeoutError):
            await inv.outcome()
    finally:
        executor.shutdown()
