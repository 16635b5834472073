"""Output buffers are bounded in bytes, not only in events: an invocation's channel
(`frontend.args.streamBufferBytes`) and a named-stream subscription (`streams.subscriberBufferBytes`)."""
from __future__ import annotations

import asyncio
import io
import json

from frontend.client import iter_sse
from frontend.keys import BROKER, EXECUTOR
from tests.support.servers import fn, test_config

MB = 1024 * 1024


async def test_a_client_that_stops_reading_holds_at_most_stream_buffer_bytes(make_client, deploy_dir):
    deploy = deploy_dir(fn("many", "hostile_fns.many_writes", timeout=60))
    client = await make_client(test_config(deploy, **{"frontend.args.streamBufferBytes": 500_000}))
    # writes of 200 kB (under the SSE reader's line limit): at most 2 fit in 500 kB
    resp = await client.post("/serverless/v1/functions/many/invocations", json={"count": 40, "size": 200_000},
                             headers={"Accept": "text/event-stream"})
    inv = next(iter(client.app[EXECUTOR].active))
    high = 0
    for _ in range(30):  # the client reads nothing for a while: the writer must wait, not buffer
        high = max(high, inv.channel.queued_bytes)
        await asyncio.sleep(0.02)
    assert 0 < high <= 500_000                                   # 2 writes, never the 100 events (20 MB)
    events = [e["data"] async for e in iter_sse(resp)]
    assert [e[:4] for e in events[:-1]] == [f"{i:04d}" for i in range(40)]  # nothing lost, in order
    assert events[-1] == "[DONE]"


async def test_a_write_larger_than_the_byte_bound_passes_alone(make_client, deploy_dir):
    deploy = deploy_dir(fn("many", "hostile_fns.many_writes", timeout=60))
    client = await make_client(test_config(deploy, **{"frontend.args.streamBufferBytes": 1000}))
    resp = await client.post("/serverless/v1/functions/many/invocations", json={"count": 3, "size": 5000},
                             headers={"Accept": "text/event-stream"})
    events = [e["data"] async for e in iter_sse(resp)]
    assert [len(e) for e in events[:-1]] == [5000] * 3 and events[-1] == "[DONE]"


async def test_a_subscriber_that_stops_reading_holds_at_most_subscriber_buffer_bytes(make_client):
    client = await make_client(**{"streams.subscriberBufferBytes": 2 * MB, "streams.maxElementSize": 2 * MB,
                                  "frontend.args.maxRequestBodySize": 16})
    subs = []
    broker = client.app[BROKER]
    original = broker.subscribe

    async def spy(*args, **kwargs):
        sub = await original(*args, **kwargs)
        subs.append(sub)
        return sub

    broker.subscribe = spy  # type: ignore[method-assign]
    slow = await client.get("/serverless/v1/streams/big")
    for _ in range(10):
        # A file-like body: aiohttp warns (ResourceWarning) about raw bytes bodies over 1 MB.
        body = io.BytesIO(json.dumps(["y" * MB]).encode())
        resp = await client.post("/serverless/v1/streams/big", data=body,
                                 headers={"Content-Type": "application/json"})
        assert resp.status == 200
        assert subs[0].buffered_bytes <= 2 * MB
    await client.post("/serverless/v1/streams/big", json=["[DONE]"])
    body = (await slow.read()).decode()
    # cut (with the id to resume after) unless loopback's socket buffers took it all
    assert ("event: error" in body and "behind" in body) or body.rstrip().endswith("[DONE]")
    await asyncio.sleep(0)
    assert subs[0].buffered_bytes == 0                          # released once the subscriber is gone
    stats = (await (await client.get("/serverless/v1/streams?stream=big")).json())["streams"][0]
    assert stats["consumers"] == 0
