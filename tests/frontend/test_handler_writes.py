"""How a handler's stream writes reach the client: awaited writes wait for room, an un-awaited
write is never lost silently, and the bound on pending writes holds."""
from __future__ import annotations

from tests.support.servers import fn, test_config

SSE = {"Accept": "text/event-stream"}


def _url(name: str) -> str:
    return f"/serverless/v1/functions/{name}/invocations"


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
