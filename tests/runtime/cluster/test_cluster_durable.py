"""Durable SSE output in cluster mode (runtime/durable.py over the Redis broker; real processes):
a client that dropped from one frontend reconnects through another and gets the rest."""
from __future__ import annotations

import json
import time

import aiohttp

from frontend.client import iter_sse
from tests.support.cluster import CLUSTER_FUNCTIONS, deploy, frontend_args, workers_serving
from tests.support.waiting import eventually

STAMPED = {"name": "stamped", "handler": "stamped.handler", "codePath": str(CLUSTER_FUNCTIONS), "timeout": 60,
           "onDisconnect": "continue"}
INVOKE = "/serverless/v1/functions/stamped/invocations"
EVENTS = "/serverless/v1/invocations/{}/events".format


async def test_a_reconnect_through_another_frontend_gets_the_rest(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    b = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)
    count = 8
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, STAMPED)
        await workers_serving(s, a.url, "stamped")
        resp = await s.post(a.url + INVOKE, json={"count": count, "delay_ms": 150},
                            headers={"Accept": "text/event-stream"})
        assert resp.status == 200
        inv_id = resp.headers["X-Invocation-Id"]
        first = []
        async for ev in iter_sse(resp):
            first.append(ev)
            if len(first) == 2:
                break
        resp.close()  # dropped from A mid-stream (onDisconnect: continue: it runs on)
        again = await s.get(b.url + EVENTS(inv_id), headers={"Last-Event-ID": "2"})
        assert again.status == 200, await again.text()
        rest = []
        async for ev in iter_sse(again):
            rest.append((time.time(), ev))
        # the same answer again, tenants' 404 on B as on A
        replay = await s.get(b.url + EVENTS(inv_id))
        replayed = [ev async for ev in iter_sse(replay)]
        unknown = await s.get(b.url + EVENTS("z" * 22))
        assert unknown.status == 404
    assert [e["id"] for e in first] == ["1", "2"]
    events = [ev for _, ev in rest]
    assert [e["id"] for e in events] == [str(i) for i in range(3, count + 2)] + [None]  # each once, then the end
    assert [json.loads(e["data"]).get("i") for e in events[:-2]] == list(range(3, count + 1))
    assert json.loads(events[-2]["data"]) == {"written": count} and events[-1]["data"] == "[DONE]"
    produced_last = json.loads(events[-3]["data"])["at"]
    assert rest[0][0] < produced_last  # live: event 3 reached B's reader before event 8 was written
    assert [(e["id"], e["data"]) for e in replayed] == [(e["id"], e["data"]) for e in first + events]


async def test_in_redis_the_kept_window_has_the_same_byte_bound(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url), "-s", "streams.invocationRetentionBytes=100")
    start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, STAMPED)
        await workers_serving(s, a.url, "stamped")
        resp = await s.post(a.url + INVOKE, json={"count": 12, "delay_ms": 1}, headers={"Accept": "text/event-stream"})
        answer = [ev async for ev in iter_sse(resp)]
        inv_id = resp.headers["X-Invocation-Id"]
        tail = await s.get(a.url + EVENTS(inv_id), headers={"Last-Event-ID": "12"})
        tail_events = [ev async for ev in iter_sse(tail)]
        whole = await s.get(a.url + EVENTS(inv_id))
        [error] = [ev async for ev in iter_sse(whole)]
    assert len(answer) == 14  # 12 events (about 40 bytes each), the result, [DONE]: far more than 100 bytes
    assert [(e["id"], e["data"]) for e in tail_events] == [("13", '{"written":12}'), (None, "[DONE]")]
    assert error["event"] == "error" and json.loads(error["data"])["lost_from_id"] == 1


async def test_a_cancel_through_another_frontend_ends_the_answer(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    b = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, STAMPED)
        await workers_serving(s, a.url, "stamped")
        resp = await s.post(a.url + INVOKE, json={"count": 1000, "delay_ms": 50},
                            headers={"Accept": "text/event-stream"})
        inv_id = resp.headers["X-Invocation-Id"]
        events = []
        async for ev in iter_sse(resp):
            events.append(ev)
            if len(events) == 2:
                cancelled = await s.post(b.url + f"/serverless/v1/invocations/{inv_id}/cancel")
                assert cancelled.status == 200, await cancelled.text()

        async def cancel_again() -> int:
            async with s.post(b.url + f"/serverless/v1/invocations/{inv_id}/cancel") as r:
                return r.status

        # the end reaches B's view through Redis after A's answer ends: over (409) once it has
        again = await eventually(cancel_again, "B to see the invocation over", accept=lambda st: st != 200)
        unknown = await s.post(b.url + "/serverless/v1/invocations/" + "q" * 22 + "/cancel")
    assert events[-1]["data"] == "[DONE]" and len(events) < 100  # ended by the cancel, long before its 1000
    assert json.loads(events[-2]["data"])["code"] == 200410
    assert again == 409 and unknown.status == 404


async def test_an_openai_stream_replays_in_its_framing_through_another_frontend(redis_server, start_server,
                                                                                 start_worker):
    """Chunks dropped from A are read from B as the same `data:` bytes, without `id:` lines."""
    from tests.support.openai_support import chat_body, chat_fn

    a = start_server(*frontend_args(redis_server.url))
    b = start_server(*frontend_args(redis_server.url))
    start_worker(redis_server.url)

    def without_pings(body: bytes) -> bytes:
        return b"".join(line for line in body.splitlines(keepends=True) if not line.startswith(b":"))

    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, {**chat_fn(tokens_per_second=40), "onDisconnect": "continue"}, "PUT")
        await workers_serving(s, a.url, "chat")
        resp = await s.post(a.url + "/v1/chat/completions", json=chat_body(stream=True))
        assert resp.status == 200
        inv_id = resp.headers["X-Invocation-Id"]
        first = b""
        while first.count(b"\n\n") < 2:
            event = await resp.content.readuntil(b"\n\n")
            first += b"" if event.startswith(b":") else event
        resp.close()  # dropped from A (onDisconnect: continue)
        rest = await s.get(b.url + EVENTS(inv_id), headers={"Last-Event-ID": "2"})
        assert rest.status == 200, await rest.text()
        tail = without_pings(await rest.read())
        whole = await s.get(b.url + EVENTS(inv_id))
        replay = without_pings(await whole.read())
    assert tail.endswith(b"data: [DONE]\n\n") and b"\nid:" not in b"\n" + tail
    assert replay == first + tail  # the same bytes, each chunk once
    assert all(e.startswith(b"data: {") for e in tail.split(b"\n\n")[:-2])
