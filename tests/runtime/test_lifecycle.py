"""Disconnects, timeouts, concurrency limits, backpressure and redeploys."""
import asyncio
import json
import socket

from frontend.keys import REGISTRY
from tests.support.servers import fn, read_events, test_config

SSE = {"Accept": "text/event-stream"}


def state_of(client, name):
    """The STATE dict of the module that deployment `name` loaded (each deployment imports its own)."""
    return client.server.app[REGISTRY].get(name).code.handler.__globals__["STATE"]


async def wait_for(predicate, timeout=3.0, step=0.02):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return predicate()


async def test_disconnect_stops_thread_handler(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("forever", "testfns.sync_forever"))))
    resp = await client.post("/serverless/v1/functions/forever/invocations", headers=SSE, json={"marker": "t"})
    events = await read_events(resp, limit=3)
    assert len(events) == 3
    resp.close()  # the client goes away mid-stream
    dep = client.server.app[REGISTRY].get("forever")
    assert await wait_for(lambda: ("stopped", "t") in state_of(client, "forever")["log"], timeout=1.0)
    assert await wait_for(lambda: dep.inflight == 0, timeout=1.0)


async def test_disconnect_cancels_async_handler(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("aforever", "testfns.async_forever"))))
    resp = await client.post("/serverless/v1/functions/aforever/invocations", headers=SSE, json={"marker": "a"})
    assert len(await read_events(resp, limit=2)) == 2
    resp.close()
    dep = client.server.app[REGISTRY].get("aforever")
    assert await wait_for(lambda: ("cancelled", "a") in state_of(client, "aforever")["log"], timeout=1.0)
    assert await wait_for(lambda: dep.inflight == 0, timeout=1.0)


async def test_disconnect_of_plain_request_cancels(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("sleepy", "testfns.async_sleep"))))
    task = asyncio.ensure_future(client.post("/serverless/v1/functions/sleepy/invocations", json={"seconds": 30}))
    dep = client.server.app[REGISTRY].get("sleepy")
    assert await wait_for(lambda: dep.inflight == 1)
    task.cancel()
    assert await wait_for(lambda: dep.inflight == 0, timeout=1.0)


async def test_timeout_async_handler_504(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("slow", "testfns.async_sleep", timeout=0.3))))
    resp = await client.post("/serverless/v1/functions/slow/invocations", json={"seconds": 5})
    assert resp.status == 504
    body = await resp.json()
    assert body["code"] == 4010 and "timed out" in body["message"]
    assert client.server.app[REGISTRY].get("slow").inflight == 0


async def test_timeout_thread_handler_and_later_writes_refused(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("slowt", "testfns.stubborn_sleep_then_write", timeout=0.2))))
    resp = await client.post("/serverless/v1/functions/slowt/invocations", headers=SSE, json={"seconds": 0.5})
    assert resp.status == 504
    events = [e for _, e in await read_events(resp)]
    assert json.loads(events[0]["data"])["code"] == 4010 and events[1]["data"] == "[DONE]"
    state = state_of(client, "slowt")
    assert await wait_for(lambda: ("late-write", "StreamClosedError") in state["log"], timeout=2)
    dep = client.server.app[REGISTRY].get("slowt")
    assert await wait_for(lambda: dep.inflight == 0)


async def test_timeout_mid_stream_is_an_error_event(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("tick", "testfns.sync_ticker", timeout=0.5))))
    resp = await client.post("/serverless/v1/functions/tick/invocations", headers=SSE,
                             json={"count": 50, "delay_ms": 100})
    assert resp.status == 200
    events = [e for _, e in await read_events(resp)]
    assert json.loads(events[0]["data"]) == {"tick": 1}
    assert json.loads(events[-2]["data"])["code"] == 4010
    assert events[-1]["data"] == "[DONE]"


async def test_concurrency_limit_429(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("one", "testfns.async_sleep", concurrency=1))))
    first = asyncio.ensure_future(client.post("/serverless/v1/functions/one/invocations", json={"seconds": 0.5}))
    dep = client.server.app[REGISTRY].get("one")
    assert await wait_for(lambda: dep.inflight == 1)
    resp = await client.post("/serverless/v1/functions/one/invocations", json={"seconds": 0})
    assert resp.status == 429
    assert (await resp.json())["code"] == 200429
    assert await (await first).json() == "woke"
    resp = await client.post("/serverless/v1/functions/one/invocations", json={"seconds": 0})
    assert resp.status == 200


async def test_backpressure_reader_that_stops_reading(make_client, deploy_dir):
    """A client that stops reading: the handler stalls, server memory stays bounded."""
    client = await make_client(test_config(deploy_dir(fn("flood", "testfns.async_forever")),
                                           **{"frontend.args.streamBufferEvents": 16}))
    sock = socket.create_connection((client.server.host, client.server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"marker": "bp", "size": 10000, "sleep": 0}).encode()
    sock.sendall(b"POST /serverless/v1/functions/flood/invocations HTTP/1.1\r\nHost: localhost\r\n"
                 b"Accept: text/event-stream\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        state = state_of(client, "flood")
        assert await wait_for(lambda: state["writes"].get("bp", 0) > 0)
        # Wait until the writer stalls: its count stops moving once buffers are full.
        previous = -1
        for _ in range(50):
            await asyncio.sleep(0.1)
            current = state["writes"]["bp"]
            if current == previous:
                break
            previous = current
        assert current == previous, "the writer never stalled"
        # bounded: the channel's 16 + what the kernel and transport buffers hold (~a few MB)
        assert current < 2000, current
        inv_channels = [len(t.get_coro().cr_frame.f_locals["inv"].channel)
                        for t in asyncio.all_tasks() if t.get_name().startswith("invocation-")]
        assert inv_channels and max(inv_channels) <= 16
    finally:
        sock.close()
    dep = client.server.app[REGISTRY].get("flood")
    assert await wait_for(lambda: dep.inflight == 0, timeout=2)


async def test_unawaited_writes_are_refused_not_buffered(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("unawaited", "testfns.async_unawaited_flood")),
                                           **{"frontend.args.streamBufferEvents": 8}))
    resp = await client.post("/serverless/v1/functions/unawaited/invocations", headers=SSE, json={"n": 1000})
    events = [e for _, e in await read_events(resp)]
    # what was accepted is delivered in order; then the clear error, then [DONE]
    data = [e["data"] for e in events]
    accepted = data[:-2]
    assert accepted == [str(i) for i in range(len(accepted))] and 8 <= len(accepted) <= 10
    assert "await context.get_stream().write" in json.loads(data[-2])["message"]
    assert data[-1] == "[DONE]"


async def test_redeploy_while_invocation_runs(make_client, deploy_dir, tmp_path):
    from tests.support.servers import HANDLERS
    client = await make_client(test_config(deploy_dir(fn("ver", "versioned_v1.handler"))))
    running = asyncio.ensure_future(client.post("/serverless/v1/functions/ver/invocations", json={"hold": 0.5}))
    dep = client.server.app[REGISTRY].get("ver")
    assert await wait_for(lambda: dep.inflight == 1)
    manifest = json.dumps({"name": "ver", "handler": "versioned_v2.handler", "codePath": str(HANDLERS)})
    resp = await client.put("/admin/v1/functions/ver", data=manifest)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["function"]["status"]["revision"] > dep.revision
    resp = await client.post("/serverless/v1/functions/ver/invocations", json={})
    assert await resp.json() == "v2"
    assert await (await running).json() == "v1"  # in flight finished on the old code


async def test_invocation_cancelled_before_its_first_step_frees_its_slot(make_client, deploy_dir):
    from runtime.invocation import Invocation
    client = await make_client(test_config(deploy_dir(fn("sleepy", "testfns.async_sleep"))))
    app = client.server.app
    dep = app[REGISTRY].get("sleepy")
    inv = Invocation(dep, {"seconds": 5}, mode="sse", loop=asyncio.get_running_loop())
    from frontend.keys import EXECUTOR
    task = app[EXECUTOR].start(inv)
    assert dep.inflight == 1
    task.cancel()  # before the task ever ran
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert task.cancelled() and dep.inflight == 0
    assert await inv.channel.get_batch() == []  # the reader is not left waiting forever


async def test_a_thread_call_aborted_by_shutdown_is_logged_as_such(make_client, deploy_dir, caplog):
    """A `def` call the drain aborts: the log says the shutdown aborted it (not that it "timed out
    after" its timeout, which it never reached); the client's answer is the shutdown's 200503."""
    from frontend.keys import EXECUTOR

    client = await make_client(test_config(deploy_dir(fn("forever", "testfns.sync_forever", timeout=600))))
    resp = await client.post("/serverless/v1/functions/forever/invocations", headers=SSE, json={"marker": "s"})
    assert len(await read_events(resp, limit=1)) == 1
    caplog.set_level("INFO", logger="fnstream.runtime")
    assert await client.server.app[EXECUTOR].drain(0) == 1
    events = [e for _, e in await read_events(resp)]
    assert json.loads(events[-2]["data"])["code"] == 200503 and events[-1]["data"] == "[DONE]"
    assert await wait_for(lambda: ("stopped", "s") in state_of(client, "forever")["log"])
    [line] = [r.getMessage() for r in caplog.records if "forever" in r.getMessage() and "thread" in r.getMessage()
              and "abandoned" not in r.getMessage()]
    assert "aborted: the server is shutting down" in line and "timed out" not in line, line
