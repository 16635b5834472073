"""Fault suite: what a client sees when a worker is killed mid-stream, when Redis stops and comes
back mid-stream (cluster mode), and when SIGTERM arrives under load. Nothing is lost silently:
every stream either completes or ends with an error/end event and `[DONE]`."""
from __future__ import annotations

import asyncio
import json
import os
import signal

import aiohttp

from frontend.client import iter_sse
from tests.support.servers import FUNCTIONS, PROCESS_FUNCTIONS

SSE = {"Accept": "text/event-stream"}


async def test_kill_9_of_a_worker_mid_stream(make_client):
    client = await make_client(**{"runtime.codeRoots": [str(PROCESS_FUNCTIONS), str(FUNCTIONS)],
                                  "runtime.deployDir": None})
    manifest = {"name": "p-tick", "handler": "proc.ticker", "codePath": ".", "executor": "process", "instances": 1}
    assert (await client.post("/admin/v1/functions", data=json.dumps(manifest))).status == 201
    resp = await client.post("/serverless/v1/functions/p-tick/invocations", json={"count": 50, "delay_ms": 50},
                             headers=SSE)
    seen: list[dict] = []
    async for ev in iter_sse(resp):
        seen.append(ev)
        if len(seen) == 3:
            status = (await (await client.get("/admin/v1/functions/p-tick")).json())["function"]["status"]
            os.kill(status["pool"]["workers"][0]["pid"], signal.SIGKILL)
    data = [e["data"] for e in seen]
    ticks = [json.loads(d)["tick"] for d in data[:-2]]
    assert ticks == list(range(1, len(ticks) + 1)) and len(ticks) >= 3   # in order, no gap before the kill
    error = json.loads(data[-2])
    assert "SIGKILL" in error["message"] and data[-1] == "[DONE]"
    st = (await (await client.get("/admin/v1/functions/p-tick")).json())["function"]["status"]
    assert st["inflight"] == 0


async def test_sigterm_under_load(start_server):
    server = start_server("-s", "frontend.args.shutdownGraceSeconds=2")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def invoke(i: int) -> list[str]:
            async with s.post(f"{server.url}/serverless/v1/functions/ticker/invocations",
                              json={"count": 1000, "delay_ms": 20}, headers=SSE) as r:
                return [e["data"] async for e in iter_sse(r)]

        async def subscribe() -> list[dict]:
            async with s.get(f"{server.url}/serverless/v1/streams/load") as r:
                return [e async for e in iter_sse(r)]

        tasks = [asyncio.ensure_future(invoke(i)) for i in range(40)]
        subs = [asyncio.ensure_future(subscribe()) for _ in range(10)]
        await asyncio.sleep(1.0)
        server.proc.send_signal(signal.SIGTERM)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        sub_results = await asyncio.wait_for(asyncio.gather(*subs), 20)
    for events in results:
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["code"] == 200503            # told why it ended
        ticks = [json.loads(e)["tick"] for e in events[:-2]]
        assert ticks == list(range(1, len(ticks) + 1))              # what was written before arrived, in order
    for events in sub_results:
        assert events[-1]["event"] == "end" and json.loads(events[-1]["data"])["reason"] == "shutdown"
    assert await asyncio.to_thread(server.proc.wait, 20) == 0
