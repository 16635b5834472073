"""The named-stream broker contract: one suite, run against every broker fnstream ships.

The memory broker (one process) and the Redis broker (cluster mode, a real redis-server on a
free port) must behave alike wherever a handler or an SSE client can tell: ids, order, fan-out,
resume without gap or duplicate, honest reports of what was lost, a slow subscriber cut with its
resume id, delete, counters. What only one of them does (the memory broker's 'block' policy and
byte caps, the Redis broker's key layout and idle expiry) is tested beside it, in
test_streams_broker.py and tests/runtime/cluster/test_cluster_streams.py.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from runtime.cluster.redis_broker import RedisBroker
from runtime.cluster.settings import connect
from runtime.streams import (
    AbstractBroker,
    AbstractSubscription,
    BrokerSettings,
    Element,
    ElementTooLargeError,
    InvalidElementError,
    InvalidStreamIdError,
    MemoryBroker,
    ProducerConfig,
    StreamDeletedError,
    StreamNotFoundError,
    StreamOptions,
    SubscriptionConfig,
    SubscriptionCutError,
    acreate_stream_consumer,
    acreate_stream_producer,
    aquery_global_consumers_num,
    aquery_global_producers_num,
    bind_broker,
    unbind_broker,
)

MakeBroker = Callable[..., Awaitable[AbstractBroker]]


@pytest.fixture(params=["memory", "redis"])
async def make_broker(request: pytest.FixtureRequest) -> AsyncIterator[MakeBroker]:
    """Factory: a fresh broker of the parametrized kind with the given BrokerSettings fields."""
    brokers: list[AbstractBroker] = []
    url = request.getfixturevalue("redis_server").url if request.param == "redis" else None

    async def factory(**settings: Any) -> AbstractBroker:
        cfg = BrokerSettings(**settings)
        broker: AbstractBroker
        if url is None:
            broker = MemoryBroker(cfg)
        else:
            broker = RedisBroker(connect(url, decode=False), f"contract{len(brokers)}", cfg)
        brokers.append(broker)
        return broker

    yield factory
    for broker in brokers:
        await broker.close()


def elements(n: int, start: int = 1) -> list[bytes]:
    return [f"e{i}".encode() for i in range(start, start + n)]


async def drain(sub: AbstractSubscription, n: int) -> list[Element]:
    got: list[Element] = []
    while len(got) < n:
        batch = await sub.next_batch(n - len(got), timeout=5)
        assert batch, f"timed out after {len(got)} of {n}"
        got.extend(batch)
    return got


async def rest(sub: AbstractSubscription) -> list[Element]:
    """Everything the subscription still has to give right now."""
    got: list[Element] = []
    while batch := await sub.next_batch(timeout=0.3):
        got.extend(batch)
    return got


async def test_fan_out_in_order_with_sequence_ids(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    subs = [await broker.subscribe("fan/out") for _ in range(3)]
    assert await broker.publish("fan/out", elements(5)) == [1, 2, 3, 4, 5]
    assert await broker.publish("fan/out", [b"\x00\xff binary"]) == [6]
    for sub in subs:
        got = await drain(sub, 6)
        assert [e.id for e in got] == [1, 2, 3, 4, 5, 6]
        assert [e.data for e in got] == [*elements(5), b"\x00\xff binary"]
        assert sub.last_id == 6
    stats = await broker.stats("fan/out")
    assert (stats.name, stats.produced, stats.delivered, stats.dropped, stats.consumers, stats.last_id) == (
        "fan/out", 6, 18, 0, 3, 6)


async def test_a_live_subscriber_gets_only_what_is_published_after_it_subscribed(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    await broker.publish("s", [b"early"])
    sub = await broker.subscribe("s")
    assert sub.lost is None
    await broker.publish("s", [b"late"])
    assert [(e.id, e.data) for e in await drain(sub, 1)] == [(2, b"late")]
    assert await sub.next_batch(timeout=0.05) == []


async def test_without_subscribers_or_retention_elements_are_counted_as_dropped(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    await broker.publish("s", elements(4))
    stats = await broker.stats("s")
    assert (stats.produced, stats.dropped, stats.delivered) == (4, 4, 0)


async def test_retention_lets_a_late_subscriber_read_everything(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    await broker.configure("s", StreamOptions(retain_num=10))
    await broker.publish("s", elements(4))
    assert (await broker.stats("s")).dropped == 0
    sub = await broker.subscribe("s", from_id=0)
    assert sub.lost is None
    await broker.publish("s", [b"live"])
    got = await drain(sub, 5)
    assert [e.id for e in got] == [1, 2, 3, 4, 5]
    assert got[-1].data == b"live"


async def test_resume_from_an_id_has_no_gap_and_no_duplicate(make_broker: MakeBroker) -> None:
    broker = await make_broker(defaults=StreamOptions(retain_num=100))
    first = await broker.subscribe("s")
    await broker.publish("s", elements(3))
    seen = await drain(first, 2)
    await first.close()
    await broker.publish("s", elements(3, start=4))
    again = await broker.subscribe("s", from_id=seen[-1].id)
    assert again.lost is None
    await broker.publish("s", [b"e7"])
    got = await drain(again, 5)
    assert [e.id for e in seen + got] == [1, 2, 3, 4, 5, 6, 7]
    assert [e.data for e in seen + got] == elements(7)
    assert await again.next_batch(timeout=0.05) == []


async def test_resume_older_than_what_is_kept_reports_exactly_the_lost_ids(make_broker: MakeBroker) -> None:
    """Each broker keeps what its bounds allow; what it no longer has is reported, never skipped silently."""
    broker = await make_broker(subscriber_buffer=5)
    await broker.configure("s", StreamOptions(retain_num=3))
    await broker.publish("s", elements(10))
    sub = await broker.subscribe("s", from_id=2)
    assert sub.lost is not None
    first_lost, last_lost = sub.lost
    assert first_lost == 3 and 3 <= last_lost < 10
    replayed = await rest(sub)
    assert [e.id for e in replayed] == list(range(last_lost + 1, 11))   # contiguous up to the newest
    assert [e.data for e in replayed] == elements(10 - last_lost, start=last_lost + 1)


async def test_resume_from_the_newest_id_loses_nothing(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    await broker.publish("t", elements(5))
    sub = await broker.subscribe("t", from_id=5)
    assert sub.lost is None
    await broker.publish("t", [b"next"])
    assert [(e.id, e.data) for e in await drain(sub, 1)] == [(6, b"next")]


@pytest.mark.parametrize("bad", [-1, 11])
async def test_a_resume_id_out_of_range_is_refused(make_broker: MakeBroker, bad: int) -> None:
    broker = await make_broker()
    await broker.publish("s", elements(10))
    with pytest.raises(InvalidStreamIdError) as info:
        await broker.subscribe("s", from_id=bad)
    assert info.value.status == 400


def sized(n: int, start: int = 1) -> list[bytes]:
    """`n` elements of exactly 10 bytes each."""
    return [f"el{i:08d}".encode() for i in range(start, start + n)]


def _at_most_5_events(received: list[Element]) -> bool:
    return len(received) <= 5


def _at_most_50_bytes(received: list[Element]) -> bool:
    return sum(len(e.data) for e in received) <= 50


@pytest.mark.parametrize(("bound", "make", "held"), [
    # streams.subscriberBuffer: 5 events
    ({"subscriber_buffer": 5}, elements, _at_most_5_events),
    # streams.subscriberBufferBytes: 50 bytes are 5 elements of 10, whatever subscriberBuffer allows
    ({"subscriber_buffer": 1000, "subscriber_buffer_bytes": 50}, sized, _at_most_50_bytes),
], ids=["events", "bytes"])
async def test_a_slow_subscriber_is_bounded_then_cut_with_its_resume_id(
        make_broker: MakeBroker, bound: dict[str, int], make: Callable[..., list[bytes]],
        held: Callable[[list[Element]], bool]) -> None:
    broker = await make_broker(**bound, policy="cut")
    slow = await broker.subscribe("s")
    fast = await broker.subscribe("s")
    for chunk in range(20):  # the fast reader keeps up, the slow one never reads
        await broker.publish("s", make(5, start=chunk * 5 + 1))
        assert [e.id for e in await drain(fast, 5)] == list(range(chunk * 5 + 1, chunk * 5 + 6))
    received: list[Element] = []
    with pytest.raises(SubscriptionCutError) as cut:
        while True:
            batch = await slow.next_batch(timeout=2)
            assert batch, "a subscriber that fell behind its bound must be cut, not left waiting"
            received.extend(batch)
    assert held(received)                                                 # it never held more than its bound
    assert [e.id for e in received] == list(range(1, len(received) + 1))  # what it got is a prefix, no gap
    resume = received[-1].id if received else 0
    assert cut.value.last_id == resume
    assert cut.value.to_dict()["resume_from_id"] == resume
    assert f"resume after id {resume}" in cut.value.message
    # Resuming from the id the cut named: the loss is reported, the rest arrives without a gap.
    again = await broker.subscribe("s", from_id=resume)
    replayed = await rest(again)
    assert again.lost is not None and again.lost[0] == resume + 1
    assert [e.id for e in replayed] == list(range(again.lost[1] + 1, 101))


async def test_delete_ends_subscriptions_and_an_unknown_stream_is_404(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    sub = await broker.subscribe("gone")
    waiting = asyncio.ensure_future(sub.next_batch())
    await asyncio.sleep(0.05)
    await broker.delete("gone")
    with pytest.raises(StreamDeletedError):
        await asyncio.wait_for(waiting, 5)
    for call in (broker.delete("gone"), broker.stats("gone")):
        with pytest.raises(StreamNotFoundError) as info:
            await call
        assert info.value.status == 404
    assert await broker.list() == []


async def test_closing_a_subscription_leaves_the_stream_and_is_idempotent(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    sub = await broker.subscribe("s")
    other = await broker.subscribe("s")
    assert (await broker.stats("s")).consumers == 2
    await sub.close()
    await sub.close()
    assert (await broker.stats("s")).consumers == 1
    await broker.publish("s", [b"still served"])
    assert [e.data for e in await drain(other, 1)] == [b"still served"]
    assert [s.name for s in await broker.list()] == ["s"]


async def test_bad_elements_publish_nothing(make_broker: MakeBroker) -> None:
    broker = await make_broker(max_element_size=10)
    sub = await broker.subscribe("s")
    with pytest.raises(ElementTooLargeError):
        await broker.publish("s", [b"ok", b"x" * 11])
    with pytest.raises(InvalidElementError):
        await broker.publish("s", [b"ok", b""])
    assert (await broker.stats("s")).produced == 0
    assert await sub.next_batch(timeout=0.05) == []
    assert await broker.publish("s", []) == []


async def test_the_agreed_terminator_reaches_subscribers(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    early = await broker.subscribe("t")  # subscribed before the producer agreed it
    await broker.attach_producer("t", StreamOptions(terminator="[DONE]"))
    assert (await broker.stats("t")).producers == 1
    late = await broker.subscribe("t")
    assert late.stream_terminator == "[DONE]"
    await broker.publish("t", [b"x", b"[DONE]"])
    assert [e.data for e in await drain(early, 2)] == [b"x", b"[DONE]"]
    assert early.stream_terminator == "[DONE]"
    await broker.detach_producer("t")
    assert (await broker.stats("t")).producers == 0


async def test_many_subscribers_each_receive_every_element(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    subs = [await broker.subscribe("s") for _ in range(20)]
    for i in range(10):
        await broker.publish("s", [f"{i}".encode()])
    results = await asyncio.gather(*(drain(s, 10) for s in subs))
    assert all([e.id for e in r] == list(range(1, 11)) for r in results)


async def test_the_handler_api_works_over_the_broker(make_broker: MakeBroker) -> None:
    """What a handler uses (runtime.create_stream_producer & co.) behaves alike over either broker."""
    broker = await make_broker()
    bind_broker(broker, asyncio.get_running_loop())
    try:
        consumer = await acreate_stream_consumer("api", SubscriptionConfig())
        async with await acreate_stream_producer("api", ProducerConfig(delay_flush_time=0)) as producer:
            assert await aquery_global_producers_num("api") == 1
            assert await aquery_global_consumers_num("api") == 1
            for i in range(5):
                await producer.asend(Element(f"v{i}".encode()))
        assert await aquery_global_producers_num("api") == 0
        got = await consumer.areceive(5000, expect_num=5)
        assert [(e.id, e.data) for e in got] == [(i + 1, f"v{i}".encode()) for i in range(5)]
        await consumer.aclose()
        assert await aquery_global_consumers_num("api") == 0
        assert await aquery_global_producers_num("never-made") == 0
    finally:
        unbind_broker(broker)
