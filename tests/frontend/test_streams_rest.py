"""Named streams over REST (in-process and a real server), the bundled functions and the CLI."""
from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time

import aiohttp
import msgpack
import pytest

from frontend.client import iter_sse
from frontend.keys import BROKER
from tests.support.servers import ROOT, assert_live

SUB = "/serverless/v1/stream/subscribe"
MSGPACK_TYPE = "application/x-msgpack"
STREAMS = "/serverless/v1/streams"


async def collect(response, stamps: list[float] | None = None) -> list[dict]:
    events = []
    async for ev in iter_sse(response):
        events.append(ev)
        if stamps is not None:
            stamps.append(time.monotonic())
    return events


async def wait_consumers(get_json, name: str, n: int) -> None:
    """Poll the stream's stats until it has `n` consumers (a readiness wait, not a timing check)."""
    for _ in range(500):
        status, body = await get_json(f"{STREAMS}?stream={name}")
        if status == 200 and body["streams"][0]["consumers"] == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"stream {name} never had {n} consumers")


def client_get_json(client):
    async def get_json(path):
        r = await client.get(path)
        return r.status, await r.json()
    return get_json


# -- subscribe before produce -----------------------------------------------------------------
async def _subscribe_then_produce(session_get, session_post, name: str):
    count, delay_ms = 5, 150
    sub = await session_get(SUB, headers={"X-Stream-Name": name, "X-Timeout-Ms": "20000"})
    assert sub.status == 200
    assert sub.headers["Content-Type"].startswith("text/event-stream")
    stamps: list[float] = []
    reading = asyncio.ensure_future(collect(sub, stamps))
    inv = await session_post("/serverless/v1/functions/stream-producer/invocations",
                             json={"stream": name, "count": count, "delay_ms": delay_ms})
    assert inv.status == 200, await inv.text()
    assert (await inv.json())["sent"] == count
    events = await asyncio.wait_for(reading, 10)
    assert [e["id"] for e in events] == [str(i) for i in range(1, count + 2)]
    assert [json.loads(e["data"])["seq"] for e in events[:-1]] == list(range(1, count + 1))
    assert events[-1]["data"] == "[DONE]"  # the terminator is the final event, then the body ends
    assert_live(stamps[:count], (count - 1) * delay_ms / 1000)   # elements arrive while the producer runs


async def test_subscribe_then_invoke_producer_in_process(make_client):
    client = await make_client()
    await _subscribe_then_produce(client.get, client.post, "live-1")


async def test_subscribe_then_invoke_producer_real_server(server):
    async with aiohttp.ClientSession(server.url) as s:
        await _subscribe_then_produce(s.get, s.post, "live/real")


async def test_stream_consumer_function_reads_until_the_terminator(make_client):
    client = await make_client()
    invoking = asyncio.ensure_future(client.post("/serverless/v1/functions/stream-consumer/invocations",
                                                 json={"stream": "to-fn", "timeout_ms": 10000}))
    await wait_consumers(client_get_json(client), "to-fn", 1)
    r = await client.post(f"{STREAMS}/to-fn", json=["a", "b", {"c": 1}, "[DONE]", "after"])
    assert r.status == 200
    assert (await r.json())["ids"] == [1, 2, 3, 4, 5]
    result = await (await invoking).json()
    assert result == {"stream": "to-fn", "elements": ["a", "b", '{"c":1}'], "ended": "terminator", "last_id": 4}


# -- retention, drops, resume ---------------------------------------------------------------------
async def test_publish_without_subscriber_is_dropped_and_counted(make_client):
    client = await make_client()
    r = await client.post(f"{STREAMS}/nobody", json=["a", "b", "c"])
    body = await r.json()
    assert body["stats"]["dropped"] == 3 and body["stats"]["produced"] == 3
    listed = await (await client.get(STREAMS)).json()
    assert [s["name"] for s in listed["streams"]] == ["nobody"]


async def test_retention_lets_a_late_subscriber_read_all(make_client):
    client = await make_client()
    r = await client.post(f"{STREAMS}/kept?retain_num=10", json=["a", "b", "c", "[DONE]"])
    assert (await r.json())["stats"]["dropped"] == 0
    events = await collect(await client.get(f"{STREAMS}/kept?from_id=0"))
    assert [(e["id"], e["data"]) for e in events] == [("1", "a"), ("2", "b"), ("3", "c"), ("4", "[DONE]")]


async def test_reconnect_with_last_event_id_has_no_gap_and_no_duplicate(make_client):
    client = await make_client(**{"streams.retainNum": 100})
    first = await client.get(f"{STREAMS}/resume")
    await wait_consumers(client_get_json(client), "resume", 1)
    await client.post(f"{STREAMS}/resume", json=["1", "2", "3"])
    seen = []
    async for ev in iter_sse(first):
        seen.append(ev)
        if len(seen) == 2:
            break
    first.close()  # the client goes away mid-stream
    await wait_consumers(client_get_json(client), "resume", 0)
    await client.post(f"{STREAMS}/resume", json=["4", "5"])
    again = await client.get(f"{STREAMS}/resume", headers={"Last-Event-ID": seen[-1]["id"]})
    await wait_consumers(client_get_json(client), "resume", 1)
    await client.post(f"{STREAMS}/resume", json=["6", "[DONE]"])
    rest = await collect(again)
    ids = [int(e["id"]) for e in seen + rest]
    assert ids == list(range(1, 8))
    assert [e["data"] for e in seen + rest] == ["1", "2", "3", "4", "5", "6", "[DONE]"]


async def test_resume_from_an_id_no_longer_retained_says_what_was_lost(make_client):
    client = await make_client()
    await client.post(f"{STREAMS}/short?retain_num=2", json=["a", "b", "c", "d", "[DONE]"])
    events = await collect(await client.get(f"{STREAMS}/short?from_id=1"))
    assert events[0]["event"] == "error"
    lost = json.loads(events[0]["data"])
    assert (lost["lost_from_id"], lost["lost_to_id"]) == (2, 3)
    assert [(e["id"], e["data"]) for e in events[1:]] == [("4", "d"), ("5", "[DONE]")]


# -- slow subscribers ----------------------------------------------------------------------------
def spy_subscriptions(app) -> list:
    broker = app[BROKER]
    subs = []
    original = broker.subscribe

    async def subscribe(*args, **kwargs):
        sub = await original(*args, **kwargs)
        subs.append(sub)
        return sub

    broker.subscribe = subscribe
    return subs


async def test_slow_rest_subscriber_is_cut_with_a_resume_id(make_client):
    client = await make_client(**{"streams.subscriberBuffer": 4, "streams.slowConsumerPolicy": "cut"})
    subs = spy_subscriptions(client.app)
    get_json = client_get_json(client)
    # Headers read, body not read: the socket buffers fill, then the subscriber's buffer of 4, and
    # it is cut. How much the kernel buffers first is its choice (loopback autotuning can take tens
    # of MB), so publish until the cut happened rather than a fixed amount that may all fit. The
    # idle timeout turns "never cut" into a failure instead of a hang.
    slow = await client.get(f"{STREAMS}/slow?timeout_ms=30000")
    big = "x" * 65536
    published = 0
    while (await get_json(f"{STREAMS}?stream=slow"))[1]["streams"][0]["consumers"] > 0:
        assert published < 4000, "a subscriber that never reads was never cut"
        await client.post(f"{STREAMS}/slow", json=[big] * 10)
        published += 10
        assert subs[0].buffered <= 4
    assert subs[0].max_buffered <= 4
    events = await collect(slow)
    assert events[-1]["event"] == "error"
    error = json.loads(events[-1]["data"])
    received = [int(e["id"]) for e in events[:-1]]
    assert received == list(range(1, len(received) + 1)) and len(received) < published
    assert error["resume_from_id"] == received[-1]
    assert f"resume after id {received[-1]}" in error["message"]


async def test_slow_rest_subscriber_blocks_the_producer_with_a_clear_error(make_client):
    client = await make_client(**{"streams.subscriberBuffer": 4, "streams.slowConsumerPolicy": "block"})
    subs = spy_subscriptions(client.app)
    # As above: publish until the producer is blocked, however much the kernel buffers first; the
    # idle timeout turns a lost element into a failure instead of a hang.
    slow = await client.get(f"{STREAMS}/blocked?expect_num=100000&timeout_ms=30000")
    big = "x" * 65536
    blocked, last = None, 0
    for _ in range(400):
        r = await client.post(f"{STREAMS}/blocked?timeout_ms=50", json=[big] * 10)
        assert subs[0].buffered <= 4
        if r.status != 200:
            blocked = await r.json()
            break
        last = (await r.json())["ids"][-1]
    assert blocked is not None and blocked["code"] == 330503
    assert "policy 'block'" in blocked["message"]
    assert subs[0].max_buffered <= 4
    published = (await (await client.get(f"{STREAMS}?stream=blocked")).json())["streams"][0]["last_id"]
    assert blocked["published"] == list(range(last + 1, published + 1))  # the rest of that batch was refused
    reading = asyncio.ensure_future(collect(slow))  # the reader drains, so the end marker goes through
    done = await client.post(f"{STREAMS}/blocked", json=["[DONE]"])
    assert done.status == 200, await done.text()
    events = await reading
    assert [int(e["id"]) for e in events] == list(range(1, published + 2))  # nothing lost, in order


# -- fan-out -------------------------------------------------------------------------------------
async def test_hundred_concurrent_rest_subscribers_each_get_every_element(make_client):
    client = await make_client()
    # A session of its own: the test client's pool (100 connections) would leave none for the POST.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        url = str(client.make_url(f"{STREAMS}/many"))
        responses = await asyncio.gather(*(session.get(url) for _ in range(100)))
        await wait_consumers(client_get_json(client), "many", 100)
        await client.post(f"{STREAMS}/many", json=[f"m{i}" for i in range(20)] + ["[DONE]"])
        results = await asyncio.gather(*(collect(r) for r in responses))
    expected = [f"m{i}" for i in range(20)] + ["[DONE]"]
    assert all([e["data"] for e in events] == expected for events in results)
    await wait_consumers(client_get_json(client), "many", 0)


# -- framing, terminators, ends -------------------------------------------------------------------
async def test_binary_elements_and_msgpack(make_client):
    client = await make_client()
    raw = b"\x00\xffbin\r\n"
    r = await client.post(f"{STREAMS}/bin?retain_num=10", data=msgpack.packb([raw, "text", "[DONE]"]),
                          headers={"Content-Type": "application/x-msgpack"})
    assert r.status == 200, await r.text()
    events = await collect(await client.get(f"{STREAMS}/bin?from_id=0"))
    assert events[0]["event"] == "binary" and base64.b64decode(events[0]["data"]) == raw
    assert events[1]["data"] == "text"
    mp = await client.get(f"{STREAMS}/bin?from_id=0", headers={"Accept": "application/x-msgpack"})
    assert mp.headers["Content-Type"] == "application/x-msgpack"
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(await mp.read())
    objs = [o for o in unpacker if o is not None]
    assert objs == [{"id": 1, "data": raw}, {"id": 2, "data": b"text"},
                    {"id": 3, "data": b"[DONE]", "end": "terminator"}]


@pytest.mark.parametrize("marker", [b"\\xE0\\xFF\\xE0\\xFF", b"\xe0\xff\xe0\xff"])
async def test_openyuanrong_end_marker_ends_the_response(make_client, marker):
    client = await make_client(**{"streams.retainNum": 10})
    await client.post(f"{STREAMS}/yr", data=msgpack.packb([b"a", marker, b"never"]),
                      headers={"Content-Type": "application/x-msgpack"})
    events = await collect(await client.get(SUB, headers={"X-Stream-Name": "yr", "Last-Event-ID": "0"}))
    assert [e["data"] for e in events] == ["a", r"\xE0\xFF\xE0\xFF"]


async def test_terminator_per_request_and_per_stream(make_client):
    client = await make_client(**{"streams.retainNum": 10})
    await client.post(f"{STREAMS}/t", json=["a", "[DONE]", "b", "::END::", "c"])
    events = await collect(await client.get(f"{SUB}?stream=t&from_id=0&terminator=::END::"))
    assert [e["data"] for e in events] == ["a", "[DONE]", "b", "::END::"]
    await client.post(f"{STREAMS}/u?terminator=STOP", json=["a", "STOP", "b"])
    events = await collect(await client.get(f"{STREAMS}/u?from_id=0"))
    assert [e["data"] for e in events] == ["a", "STOP"]


async def test_idle_timeout_and_expect_num_end_with_an_event(make_client):
    client = await make_client(**{"streams.retainNum": 10})
    events = await collect(await client.get(SUB, headers={"X-Stream-Name": "idle", "X-Timeout-Ms": "100"}))
    assert events[-1]["event"] == "end" and json.loads(events[-1]["data"])["reason"] == "idle_timeout"
    await client.post(f"{STREAMS}/idle", json=["a", "b", "c"])
    events = await collect(await client.get(SUB, headers={"X-Stream-Name": "idle", "X-Expect-Num": "2",
                                                          "Last-Event-ID": "0"}))
    assert [e["data"] for e in events[:2]] == ["a", "b"]
    assert json.loads(events[2]["data"])["reason"] == "expect_num"


async def test_heartbeats_while_idle(make_client):
    client = await make_client(**{"frontend.args.heartbeatSeconds": 0.05})
    r = await client.get(f"{STREAMS}/hb?timeout_ms=300")
    body = (await r.read()).decode()
    assert body.startswith(": subscribed to hb\n")
    assert ": ping\n" in body and ": ping\n\n" not in body


async def test_delete_ends_live_subscribers(make_client):
    client = await make_client()
    sub = await client.get(f"{STREAMS}/gone")
    await wait_consumers(client_get_json(client), "gone", 1)
    r = await client.delete(f"{STREAMS}/gone")
    assert r.status == 200
    events = await collect(sub)
    assert events[-1]["event"] == "error" and "deleted" in json.loads(events[-1]["data"])["message"]
    assert (await client.delete(f"{STREAMS}/gone")).status == 404


async def test_names_with_reserved_characters_via_the_path(make_client):
    client = await make_client(**{"streams.retainNum": 10})
    r = await client.post(f"{STREAMS}/a%2Fb%23c%25d", json=["x", "[DONE]"])
    assert (await r.json())["stream"] == "a/b#c%d"
    events = await collect(await client.get(SUB, headers={"X-Stream-Name": "a/b#c%d", "Last-Event-ID": "0"}))
    assert [e["data"] for e in events] == ["x", "[DONE]"]


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("method,path,kwargs,status", [
    ("GET", SUB, {}, 400),                                                     # no name
    ("GET", SUB, {"headers": {"X-Stream-Name": "has space"}}, 400),
    ("GET", SUB, {"headers": {"X-Stream-Name": "a" * 256}}, 400),
    ("GET", SUB, {"headers": {"X-Stream-Name": "s", "X-Timeout-Ms": "soon"}}, 400),
    ("GET", SUB, {"headers": {"X-Stream-Name": "s", "X-Timeout-Ms": "-5"}}, 400),
    ("GET", SUB, {"headers": {"X-Stream-Name": "s", "X-Expect-Num": "0"}}, 400),
    ("GET", SUB, {"headers": {"X-Stream-Name": "s", "Last-Event-ID": "abc"}}, 400),
    ("GET", f"{STREAMS}/s?from_id=-1", {}, 400),
    ("GET", f"{STREAMS}/s?from_id=99", {}, 400),                               # beyond the last id
    ("POST", f"{STREAMS}/s", {"data": b""}, 400),
    ("POST", f"{STREAMS}/s", {"data": b"[1, 2"}, 400),
    ("POST", f"{STREAMS}/s", {"json": []}, 400),
    ("POST", f"{STREAMS}/s", {"json": ["ok", ""]}, 400),
    ("POST", f"{STREAMS}/s", {"json": ["ok", "x" * 65]}, 413),
    ("POST", f"{STREAMS}/s?retain_num=many", {"json": ["ok"]}, 400),
    ("POST", f"{STREAMS}/s?policy=drop", {"json": ["ok"]}, 400),
    ("POST", f"{STREAMS}/bad%20name", {"json": ["ok"]}, 400),
    ("POST", f"{STREAMS}/new%0Aline", {"json": ["ok"]}, 400),                  # a bad name, not an unknown route
    ("GET", f"{STREAMS}/new%0Aline", {}, 400),
    ("DELETE", f"{STREAMS}/new%0Aline", {}, 400),
    ("DELETE", f"{STREAMS}/unknown", {}, 404),
    ("GET", f"{STREAMS}?stream=unknown", {}, 404),
])
async def test_bad_input_is_a_clear_4xx_and_loses_nothing(make_client, method, path, kwargs, status):
    client = await make_client(**{"streams.maxElementSize": 64})
    await client.post(f"{STREAMS}/s", json=["first"])
    r = await client.request(method, path, **kwargs)
    assert r.status == status, await r.text()
    body = await r.json()
    assert body["message"] and body["code"]
    stats = (await (await client.get(f"{STREAMS}?stream=s")).json())["streams"][0]
    assert stats["produced"] == 1 and stats["consumers"] == 0


@pytest.mark.parametrize("body,content_type", [
    (json.dumps(list(range(6))).encode(), "application/json"),
    (b"\n".join(b"%d" % i for i in range(6)), "application/x-ndjson"),
    (msgpack.packb(list(range(6))), MSGPACK_TYPE),
])
async def test_a_publish_of_too_many_elements_is_413_and_publishes_nothing(make_client, body, content_type):
    """Each element of a publish costs loop time: their number is bounded (streams.maxElementsPerPublish)."""
    client = await make_client(**{"streams.maxElementsPerPublish": 5})
    ok = await client.post(f"{STREAMS}/many", json=[1, 2, 3, 4, 5])
    assert ok.status == 200, await ok.text()
    r = await client.post(f"{STREAMS}/many", data=body, headers={"Content-Type": content_type})
    assert r.status == 413, await r.text()
    answer = await r.json()
    assert answer["code"] == 4140 and "streams.maxElementsPerPublish" in answer["message"]
    assert r.headers["X-Inner-Code"] == "4140"
    stats = (await (await client.get(f"{STREAMS}?stream=many")).json())["streams"][0]
    assert stats["produced"] == 5


async def test_streams_need_the_developer_role(make_client):
    tokens = [{"token": "dev", "role": "developer"}, {"token": "usr", "role": "user"}]
    client = await make_client(**{"auth.tokens": tokens})
    assert (await client.get(f"{STREAMS}")).status == 401
    assert (await client.get(STREAMS, headers={"Authorization": "Bearer usr"})).status == 403
    assert (await client.post(f"{STREAMS}/x", json=["a"], headers={"Authorization": "Bearer usr"})).status == 403
    assert (await client.get(STREAMS, headers={"Authorization": "Bearer dev"})).status == 200


# -- CLI ----------------------------------------------------------------------------------------
async def test_cli_subscribe_and_publish(server):
    cli = [sys.executable, "-m", "frontend.cli"]
    sub = await asyncio.create_subprocess_exec(*cli, "subscribe", "cli/s", "--url", server.url, cwd=ROOT,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    async with aiohttp.ClientSession(server.url) as s:
        async def get_json(path):
            async with s.get(path) as r:
                return r.status, await r.json()
        await wait_consumers(get_json, "cli/s", 1)
    pub = await asyncio.create_subprocess_exec(*cli, "publish", "cli/s", "one", "two words", "[DONE]",
                                               "--url", server.url, cwd=ROOT, stdout=subprocess.PIPE)
    out, _ = await pub.communicate()
    assert pub.returncode == 0 and json.loads(out)["ids"] == [1, 2, 3]
    out, err = await asyncio.wait_for(sub.communicate(), 20)
    assert sub.returncode == 0, err
    assert out.decode().splitlines() == ["one", "two words", "[DONE]"]
