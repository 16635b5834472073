"""Named streams in cluster mode: Redis Streams shared by every node (real redis-server, real processes)."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from frontend.client import iter_sse
from runtime.cluster.redis_broker import RedisBroker
from runtime.cluster.settings import connect
from runtime.config import load_config
from runtime.errors import BadRequestError, ConfigError
from runtime.streams import BrokerSettings, StreamNotFoundError, StreamOptions, SubscriptionCutError
from tests.support.cluster import frontend_args, wait_until, workers_serving
from tests.support.servers import read_events

SUB = "/serverless/v1/stream/subscribe"
STREAMS = "/serverless/v1/streams"


async def consumers(s, base: str, name: str) -> int:
    async with s.get(f"{base}{STREAMS}?stream={name}") as r:
        return r.status == 200 and (await r.json())["streams"][0]["consumers"]


async def test_subscribe_on_a_while_a_function_invoked_on_b_produces(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url))
    b = start_server(*frontend_args(redis_server.url))
    worker = start_worker(redis_server.url)
    count = 5
    async with aiohttp.ClientSession() as s:
        await workers_serving(s, b.url, "stream-producer")
        sub = await s.get(a.url + SUB, headers={"X-Stream-Name": "across", "X-Timeout-Ms": "20000"})
        assert sub.status == 200
        reading = asyncio.ensure_future(read_events(sub))
        started = time.monotonic()
        async with s.post(b.url + "/serverless/v1/functions/stream-producer/invocations",
                          json={"stream": "across", "count": count, "delay_ms": 200}) as inv:
            assert inv.status == 200, await inv.text()
            assert (await inv.json())["sent"] == count
        answered = time.monotonic()  # the producer's invocation is over: every element was sent
        stamps, events = map(list, zip(*await asyncio.wait_for(reading, 10), strict=True))
        sub.close()
    assert [e["id"] for e in events] == [str(i) for i in range(1, count + 2)]
    assert [json.loads(e["data"])["seq"] for e in events[:-1]] == list(range(1, count + 1))
    assert events[-1]["data"] == "[DONE]"                     # the response ends on the terminator
    assert started < stamps[0] < answered                     # the first arrived while the producer ran
    assert worker.proc.poll() is None


async def test_last_event_id_resume_across_nodes(redis_server, start_server):
    a = start_server(*frontend_args(redis_server.url, role="all"))
    b = start_server(*frontend_args(redis_server.url, role="all"))
    async with aiohttp.ClientSession() as s:
        first = await s.get(f"{b.url}{STREAMS}/resume")
        await wait_until(lambda: consumers(s, a.url, "resume"), "a subscriber on B")
        async with s.post(f"{a.url}{STREAMS}/resume", json=["1", "2", "3"]) as r:
            assert r.status == 200, await r.text()
        seen = []
        async for ev in iter_sse(first):
            seen.append(ev)
            if len(seen) == 2:
                break
        first.close()
        async with s.post(f"{a.url}{STREAMS}/resume", json=["4", "5"]) as r:
            assert r.status == 200
        again = await s.get(f"{a.url}{STREAMS}/resume", headers={"Last-Event-ID": seen[-1]["id"]})
        async with s.post(f"{b.url}{STREAMS}/resume", json=["6", "[DONE]"]) as r:
            assert r.status == 200
        rest = [ev async for ev in iter_sse(again)]
    assert [int(e["id"]) for e in seen + rest] == list(range(1, 8))
    assert [e["data"] for e in seen + rest] == ["1", "2", "3", "4", "5", "6", "[DONE]"]
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{b.url}{STREAMS}?stream=resume") as r:
            stats = (await r.json())["streams"][0]
    assert stats["produced"] == 7 and stats["delivered"] >= 7                 # counted on whichever node
    assert stats["retained_bytes"] == len("123456[DONE]")                    # all within the bound


@pytest.fixture
async def broker(redis_server):
    b = RedisBroker(connect(redis_server.url, decode=False), "fnstream", BrokerSettings(subscriber_buffer=5))
    yield b
    await b.close()


async def test_fan_out_order_and_hash_tagged_keys(broker, redis_server):
    subs = [await broker.subscribe("fan/out") for _ in range(3)]
    ids = await broker.publish("fan/out", [b"a", b"b\x00\xff", b"c"])
    assert ids == [1, 2, 3]
    for sub in subs:
        batch = await sub.next_batch(timeout=1)
        assert [(e.id, e.data) for e in batch] == [(1, b"a"), (2, b"b\x00\xff"), (3, b"c")]
    keys = redis_server.client().keys("*")
    assert sorted(k for k in keys if "stream" in k and k != "fnstream:streams") == [
        "fnstream:{stream:fan/out}:meta", "fnstream:{stream:fan/out}:s"]
    assert (await broker.stats("fan/out")).consumers == 3


async def test_slow_subscriber_is_bounded_and_cut_with_resume_id(broker, redis_server):
    sub = await broker.subscribe("slow")
    await broker.publish("slow", [b"1", b"2"])
    assert [e.id for e in await sub.next_batch(timeout=1)] == [1, 2]
    await broker.publish("slow", [str(i).encode() for i in range(3, 51)])
    assert redis_server.client().xlen("fnstream:{stream:slow}:s") == 5    # memory stays bounded
    with pytest.raises(SubscriptionCutError) as cut:
        await sub.next_batch(timeout=1)
    assert cut.value.last_id == 2
    late = await broker.subscribe("slow", from_id=2)
    assert late.lost == (3, 45)
    assert [e.id for e in await late.next_batch(timeout=1)] == [46, 47, 48, 49, 50]


async def test_reads_and_the_kept_window_are_bounded_in_subscriber_bytes(redis_server):
    """streams.subscriberBufferBytes in Redis: a read returns at most that many bytes (a larger element
    alone), and beyond retain_num the stream keeps at most that many bytes for slow subscribers."""
    b = RedisBroker(connect(redis_server.url, decode=False), "fnstream",
                    BrokerSettings(subscriber_buffer=1000, subscriber_buffer_bytes=50))
    try:
        await b.configure("kept", StreamOptions(retain_num=100))
        sizes = [10, 10, 10, 10, 80, 10, 10]
        await b.publish("kept", [b"x" * n for n in sizes])
        sub = await b.subscribe("kept", from_id=0)
        batches = []
        while sum(map(len, batches)) < len(sizes):
            batch = await sub.next_batch(timeout=1)
            assert batch and (sum(len(e.data) for e in batch) <= 50 or len(batch) == 1), batch
            batches.append(batch)
        assert [len(e.data) for batch in batches for e in batch] == sizes and len(batches) == 3
        await b.publish("window", [b"y" * 10] * 20)        # no retention: only the window is kept
        kept = redis_server.client().xrange("fnstream:{stream:window}:s")
        assert [int(i.split("-")[1]) for i, _ in kept] == [16, 17, 18, 19, 20]
        assert (await b.stats("window")).retained_bytes == 50
        await b.publish("window", [b"z" * 70])             # larger than the window: kept alone
        assert redis_server.client().xlen("fnstream:{stream:window}:s") == 1
    finally:
        await b.close()


async def test_stats_count_delivered_dropped_and_retained_bytes(broker, redis_server):
    await broker.publish("counted", [b"ab", b"cde"])          # no subscriber, no retention asked: dropped
    st = await broker.stats("counted")
    assert (st.produced, st.delivered, st.dropped, st.retained, st.retained_bytes) == (2, 0, 2, 2, 5)
    subs = [await broker.subscribe("counted") for _ in range(2)]
    await broker.publish("counted", [b"x" * 10] * 3)
    for sub in subs:
        assert len(await sub.next_batch(timeout=1)) == 3
    await broker.publish("counted", [b"1", b"2", b"3", b"4"])   # 9 elements, bound 5: the 4 oldest go
    for sub in subs:
        assert [e.data for e in await sub.next_batch(timeout=1)] == [b"1", b"2", b"3", b"4"]
    st = await broker.stats("counted")
    kept = redis_server.client().xrange("fnstream:{stream:counted}:s")
    assert (st.produced, st.delivered, st.dropped, st.retained) == (9, 14, 2, 5)
    assert st.retained_bytes == sum(len(f["d"]) for _, f in kept) == 14
    await broker.delete("counted")
    for sub in subs:
        await sub.close()                                       # a late update does not bring it back
    with pytest.raises(StreamNotFoundError):
        await broker.stats("counted")


async def test_a_stream_is_never_seen_without_its_terminator(broker, redis_server):
    """Another frontend replays a kept OpenAI answer in its framing when the stream's terminator is
    `[DONE]` (runtime/durable.py find_shared): a reader that sees the stream exist while it is still
    being configured must see the terminator already. The configure is held after its first step."""
    reached, release = asyncio.Event(), asyncio.Event()
    hmget = broker.redis.hmget

    async def held_hmget(*args, **kwargs):
        reached.set()
        await release.wait()
        return await hmget(*args, **kwargs)

    broker.redis.hmget = held_hmget
    configuring = asyncio.create_task(broker.configure("chat", StreamOptions(terminator="[DONE]")))
    await reached.wait()  # the stream exists in Redis now
    assert (await broker.stats("chat")).terminator == "[DONE]"
    release.set()
    await configuring
    assert (await broker.stats("chat")).terminator == "[DONE]"


async def test_block_policy_is_refused_in_cluster_mode(broker):
    with pytest.raises(BadRequestError, match="'block' is not offered in cluster mode"):
        await broker.configure("blocky", StreamOptions(policy="block"))


def test_block_policy_is_refused_in_a_cluster_config():
    with pytest.raises(ConfigError, match=r"streams\.slowConsumerPolicy"):
        load_config(data={"cluster": {"redisUrl": "redis://x:1/0"}, "streams": {"slowConsumerPolicy": "block"}})
    load_config(data={"streams": {"slowConsumerPolicy": "block"}})   # fine without cluster mode


async def test_idle_streams_expire_but_a_waiting_subscriber_keeps_its_stream(redis_server):
    b = RedisBroker(connect(redis_server.url, decode=False), "fnstream",
                    BrokerSettings(subscriber_buffer=5, idle_seconds=0.5))
    try:
        await b.publish("once", [b"x"])                       # a stream used once, then nobody
        waiting = await b.subscribe("watched")
        assert await waiting.next_batch(timeout=1.5) == []    # waits past the idle time, polling
        await asyncio.sleep(0.3)
        with pytest.raises(StreamNotFoundError):
            await b.stats("once")                             # forgotten
        assert [s.name for s in await b.list()] == ["watched"]
        assert await b.publish("watched", [b"still"]) == [1]  # ids did not restart under the subscriber
        assert [e.data for e in await waiting.next_batch(timeout=2)] == [b"still"]
        await waiting.close()
    finally:
        await b.close()
