"""Regression tests for bugs found in review (each test failed before its fix)."""
import asyncio

import pytest

from frontend.keys import EXECUTOR, REGISTRY
from tests.support.servers import fn, test_config

SSE = {"Accept": "text/event-stream"}
DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON nested far beyond Python's recursion limit


def _url(name: str) -> str:
    return f"/serverless/v1/functions/{name}/invocations"


# -- 1. an un-awaited write still pending when an async handler returns is lost -----------------
async def test_unawaited_last_write_is_not_lost(make_client, deploy_dir):
    """README: "an un-awaited write to a full buffer is refused at the next write". With no next
    write, the pending write used to fail against the closed channel: the event vanished silently."""
    d = deploy_dir(fn("unawaited", "review_fns.unawaited_writes"))
    client = await make_client(test_config(d, **{"frontend.args.streamBufferEvents": 2}))
    resp = await client.post(_url("unawaited"), headers=SSE, json={"n": 3})
    body = (await resp.read()).decode()
    assert resp.status == 200
    assert "data: e0\n" in body and "data: e1\n" in body
    assert "data: e2\n" in body, body
    assert body.endswith('data: "done"\n\ndata: [DONE]\n\n')


# -- 2. deeply nested JSON bodies are a 500 text page instead of a 400 --------------------------
@pytest.mark.parametrize("path", [_url("recho"), "/serverless/v1/streams/deep", "/v1/chat/completions"])
async def test_deeply_nested_json_body_is_400(make_client, deploy_dir, path):
    d = deploy_dir(fn("recho", "review_fns.echo"))
    client = await make_client(test_config(d))
    resp = await client.post(path, data=DEEP)
    assert resp.status == 400, (resp.status, (await resp.read())[:200])
    assert resp.headers["Content-Type"].startswith("application/json")


async def test_deeply_nested_msgpack_element_is_400(make_client):
    """msgpack accepts ~1000 levels, json.dumps (each element is sent as JSON text) does not."""
    client = await make_client(test_config())
    body = b"\x91" + b"\x91" * 1000 + b"\x01"
    resp = await client.post("/serverless/v1/streams/deep", data=body,
                             headers={"Content-Type": "application/x-msgpack"})
    assert resp.status == 400, (resp.status, (await resp.read())[:200])


# -- 3. a CancelledError raised by the handler's own code kills the connection ------------------
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


# -- 4. shutdownGraceSeconds: 0 waited for in-flight invocations forever -----------------------
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


# -- 5. concurrent coroutines of one handler that each await their writes get StreamBufferFullError
async def test_concurrent_awaited_writes_wait_for_room(make_client, deploy_dir):
    """README: on the loop, `await stream.write(x)` waits for room. With two coroutines of one
    handler (asyncio.gather) the writer kept ONE pending write: the second coroutine's properly
    awaited write was refused with "use `await ...write()`" as soon as the buffer was full."""
    d = deploy_dir(fn("fanout", "review_fns.fanout"))
    client = await make_client(test_config(d, **{"frontend.args.streamBufferEvents": 2}))
    resp = await client.post(_url("fanout"), headers=SSE, json={"n": 5})
    body = (await resp.read()).decode()
    assert "buffer is full" not in body, body
    data = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    assert sorted(data[:-2]) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)])
    assert data[-2:] == ['"done"', "[DONE]"]
    assert [d for d in data if d.startswith("a")] == [f"a{i}" for i in range(5)]  # order per coroutine


async def test_second_unawaited_write_to_full_buffer_still_refused(make_client, deploy_dir):
    """The bound the per-task pending write keeps: one task, two un-awaited writes to a full buffer."""
    d = deploy_dir(fn("unawaited", "review_fns.unawaited_writes"))
    client = await make_client(test_config(d, **{"frontend.args.streamBufferEvents": 2}))
    resp = await client.post(_url("unawaited"), headers=SSE, json={"n": 4})
    body = (await resp.read()).decode()
    assert "stream buffer is full" in body and body.endswith("data: [DONE]\n\n"), body


# -- 6. a timeout dropped the events the handler wrote before its deadline ----------------------
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
    [dep] = registry.deploy(load_deploy_dir(d))
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


# -- 7. a refused subscription (400) created the stream anyway ----------------------------------
async def test_refused_subscribe_creates_no_stream(make_client):
    """`Last-Event-ID: 5` on an unknown stream is a 400, but the stream was created first and
    stayed, taking one of streams.maxStreams for good (bad input must leave nothing behind)."""
    client = await make_client(test_config(**{"streams.maxStreams": 1}))
    resp = await client.get("/serverless/v1/stream/subscribe", headers={"X-Stream-Name": "fresh", "Last-Event-ID": "5"})
    assert resp.status == 400
    assert (await (await client.get("/serverless/v1/streams")).json())["streams"] == []
    resp = await client.post("/serverless/v1/streams/other", json=["x"])
    assert resp.status == 200, await resp.text()


# -- 8. a token that is not UTF-8 was a 500 text page instead of a 401 --------------------------
async def _raw_http(client, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize("header", [b"Authorization: Bearer s\xe9cret", b"X-Auth: \xff\xfe"])
async def test_non_utf8_token_is_401(make_client, header):
    """aiohttp hands non-UTF-8 header bytes over as surrogates; `str.encode()` then raised
    UnicodeEncodeError in the token check: 500 "Server got itself in trouble" (not JSON)."""
    tokens = [{"token": "secret", "tenant": "default", "role": "developer"}]
    client = await make_client(test_config(**{"auth.tokens": tokens}))
    answer = await _raw_http(client, b"GET /serverless/v1/streams HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                     + header + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b'"code": 200401' in answer


# -- 9. a non-UTF-8 X-Stream-Terminator broke the subscription after its 200 --------------------
async def test_non_utf8_terminator_header_is_400(make_client):
    """terminator_set() encodes the terminator inside the pump, after the 200 and the first
    comment went out: the UnicodeEncodeError aborted the response mid-chunk (no end, no error)."""
    client = await make_client(test_config())
    answer = await _raw_http(client, b"GET /serverless/v1/stream/subscribe HTTP/1.1\r\nHost: x\r\n"
                                     b"Connection: close\r\nX-Stream-Name: s\r\nX-Timeout-Ms: 300\r\n"
                                     b"X-Stream-Terminator: \xff\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
