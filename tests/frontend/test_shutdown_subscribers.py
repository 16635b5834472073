"""SIGTERM with named-stream subscribers: each gets a final `event: end` (reason shutdown) within
the grace, after what was published; the server then exits 0."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp

from frontend.client import iter_sse


async def test_subscribers_get_end_shutdown_within_the_grace(start_server):
    server = start_server("-s", "frontend.args.shutdownGraceSeconds=3")
    async with aiohttp.ClientSession() as s:
        subs = [await s.get(f"{server.url}/serverless/v1/streams/live") for _ in range(5)]
        async with s.post(f"{server.url}/serverless/v1/streams/live", json=["one", "two"]) as r:
            assert r.status == 200
        readers = [asyncio.ensure_future(_events(sub)) for sub in subs]
        await asyncio.sleep(0.2)
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        results = await asyncio.wait_for(asyncio.gather(*readers), 15)
        took = time.monotonic() - start
    for events in results:
        assert [e["data"] for e in events[:2]] == ["one", "two"]         # nothing lost before the end
        assert events[-1].get("event") == "end", events
        end = json.loads(events[-1]["data"])
        assert end["reason"] == "shutdown" and end["last_id"] == 2
    assert took < 3 + 1.5                                                # within the grace (3 s) + exit
    assert await asyncio.to_thread(server.proc.wait, 15) == 0


async def _events(resp: aiohttp.ClientResponse) -> list[dict]:
    return [e async for e in iter_sse(resp)]
