"""What only the in-process (memory) broker does, and the handler API, without HTTP.

What every broker must do is the contract suite, test_broker_contract.py."""
from __future__ import annotations

import asyncio
import gc

import pytest

from runtime.streams import (
    BrokerSettings,
    Element,
    InvalidStreamNameError,
    MemoryBroker,
    ProducerConfig,
    StreamBlockedError,
    StreamLimitError,
    StreamOptions,
    SubscriptionConfig,
    SubscriptionCutError,
    acreate_stream_consumer,
    acreate_stream_producer,
    bind_broker,
    create_stream_consumer,
    create_stream_producer,
    query_global_producers_num,
    terminator_forms,
    unbind_broker,
    validate_stream_name,
)


def elements(n: int, start: int = 1) -> list[bytes]:
    return [f"e{i}".encode() for i in range(start, start + n)]


async def drain(sub, n: int) -> list[Element]:
    got: list[Element] = []
    while len(got) < n:
        batch = await sub.next_batch(n - len(got), timeout=5)
        assert batch, f"timed out after {len(got)} of {n}"
        got.extend(batch)
    return got


async def test_resume_older_than_retention_reports_lost_ids():
    broker = MemoryBroker()
    await broker.configure("s", StreamOptions(retain_num=3))
    await broker.publish("s", elements(10))
    sub = await broker.subscribe("s", from_id=2)
    assert sub.lost == (3, 7)
    assert [e.id for e in await drain(sub, 3)] == [8, 9, 10]
    nothing_kept = MemoryBroker()
    await nothing_kept.publish("t", elements(5))
    assert (await nothing_kept.subscribe("t", from_id=1)).lost == (2, 5)
    assert (await nothing_kept.subscribe("t", from_id=5)).lost is None


async def test_cut_policy_bounds_the_buffer_and_names_the_resume_id():
    broker = MemoryBroker(BrokerSettings(subscriber_buffer=5, policy="cut"))
    slow = await broker.subscribe("s")
    fast = await broker.subscribe("s")
    for chunk in range(20):  # the fast reader keeps up, the slow one never reads
        await broker.publish("s", elements(5, start=chunk * 5 + 1))
        assert slow.buffered <= 5
        await drain(fast, 5)
    assert slow.max_buffered == 5
    assert fast.max_buffered <= 5
    got = await drain(slow, 5)
    assert [e.id for e in got] == [1, 2, 3, 4, 5]
    with pytest.raises(SubscriptionCutError) as info:
        await slow.next_batch(timeout=1)
    assert info.value.last_id == 5
    assert info.value.to_dict()["resume_from_id"] == 5
    assert "resume after id 5" in info.value.message
    assert (await broker.stats("s")).consumers == 1


async def test_block_policy_bounds_the_buffer_and_times_out_with_a_clear_error():
    broker = MemoryBroker(BrokerSettings(subscriber_buffer=5, policy="block"))
    sub = await broker.subscribe("s")
    with pytest.raises(StreamBlockedError) as info:
        await broker.publish("s", elements(8), timeout=0.05)
    assert info.value.published == [1, 2, 3, 4, 5]
    assert "ids 1..5 were published" in info.value.message
    assert sub.max_buffered == 5
    # With a reader (however slow), every element arrives and the buffer never exceeds 5.
    received: list[int] = []

    async def reader():
        while len(received) < 105:
            batch = await sub.next_batch(2, timeout=5)
            assert batch
            received.extend(e.id for e in batch)
            await asyncio.sleep(0)

    task = asyncio.create_task(reader())
    await broker.publish("s", elements(100, start=6), timeout=5)
    await task
    assert received == list(range(1, 106))
    assert sub.max_buffered == 5


async def test_retention_never_exceeds_its_byte_caps():
    broker = MemoryBroker(BrokerSettings(max_stream_size=1000))
    await broker.configure("s", StreamOptions(retain_seconds=3600))  # time alone: the byte cap still holds
    for _ in range(50):
        await broker.publish("s", [b"x" * 100])
        assert (await broker.stats("s")).retained_bytes <= 1000
    await broker.configure("b", StreamOptions(retain_bytes=250))
    for _ in range(10):
        await broker.publish("b", [b"y" * 100])
    stats = await broker.stats("b")
    assert (stats.retained, stats.retained_bytes, stats.first_retained_id) == (2, 200, 9)


async def test_retained_elements_add_no_object_for_the_collector_to_walk() -> None:
    """Every SSE invocation's output is kept: an element is two list slots, not an object of its
    own (a tuple and an int each: ~100 B, and work for the collector's young generation)."""
    broker = MemoryBroker()
    await broker.configure("s", StreamOptions(retain_num=100_000))
    batches = [elements(1000, 1 + 1000 * i) for i in range(10)]
    gc.disable()
    try:
        gc.collect()
        young = gc.get_count()[0]  # objects the collector tracks made since: what triggers a collection
        for batch in batches:
            await broker.publish("s", batch)
        made = gc.get_count()[0] - young
    finally:
        gc.enable()
    assert made < 100
    stats = await broker.stats("s")
    assert (stats.retained, stats.first_retained_id) == (10_000, 1)
    sub = await broker.subscribe("s", from_id=9_990, buffer=100)
    assert [(e.id, e.data) for e in await drain(sub, 10)] == [(9_990 + i, b"e%d" % (9_990 + i)) for i in range(1, 11)]


@pytest.mark.parametrize("options", [StreamOptions(retain_bytes=250), StreamOptions(retain_num=3),
                                     StreamOptions(retain_seconds=3600), StreamOptions(retain_for_num_consumers=1)])
async def test_a_batch_is_kept_as_its_elements_one_by_one_would_be(options):
    """A batch no subscriber waits for is kept and evicted at once (the fast path every kept
    invocation output takes): what stays, what counts as dropped, and a replay are as if each
    element had come alone, an element too large for the caps included."""
    sizes = [10, 120, 40, 400, 30, 90, 60, 5]
    data = [bytes([97 + i]) * n for i, n in enumerate(sizes)]
    broker = MemoryBroker(BrokerSettings(max_stream_size=300))
    seen = []
    for name, batches in (("whole", [data]), ("alone", [[d] for d in data])):
        await broker.configure(name, options)
        ids = [i for batch in batches for i in await broker.publish(name, batch)]
        stats = await broker.stats(name)
        sub = await broker.subscribe(name, from_id=0)
        replay = await sub.next_batch(timeout=0.01) or []
        await sub.close()
        seen.append((ids, stats.retained, stats.retained_bytes, stats.first_retained_id, stats.dropped,
                     [(e.id, e.data) for e in replay]))
    assert seen[0] == seen[1]
    assert seen[0][0] == list(range(1, 9)) and seen[0][2] <= 300


async def test_retain_for_num_consumers_keeps_elements_for_the_first_consumers():
    broker = MemoryBroker()
    await broker.attach_producer("s", StreamOptions(retain_for_num_consumers=2))
    await broker.publish("s", elements(3))
    a = await broker.subscribe("s")
    b = await broker.subscribe("s")
    assert [e.id for e in await drain(a, 3)] == [1, 2, 3]
    assert [e.id for e in await drain(b, 3)] == [1, 2, 3]
    assert (await broker.stats("s")).retained == 0  # released once both subscribed
    c = await broker.subscribe("s")
    assert await c.next_batch(timeout=0.01) == []


@pytest.mark.parametrize("name", ["", "has space", "a" * 256, "tab\t", "é", "a,b", "a?b"])
def test_bad_names_are_refused(name):
    with pytest.raises(InvalidStreamNameError):
        validate_stream_name(name)


def test_good_names():
    for name in ["a", "a" * 255, "x~.-/_!@#%^&*()+=;:Z9"]:
        assert validate_stream_name(name) == name


def test_terminator_forms_cover_the_yuanrong_marker_as_text_and_bytes():
    forms = terminator_forms(r"\xE0\xFF\xE0\xFF")
    assert forms == {b"\\xE0\\xFF\\xE0\\xFF", b"\xe0\xff\xe0\xff"}
    assert terminator_forms("[DONE]") == {b"[DONE]"}


# -- handler API ---------------------------------------------------------------------------------
@pytest.fixture
async def api_broker():
    broker = MemoryBroker()
    bind_broker(broker, asyncio.get_running_loop())
    yield broker
    unbind_broker(broker)


async def test_delay_flush_time_batches_until_flush(api_broker):
    consumer = await acreate_stream_consumer("batch")
    producer = await acreate_stream_producer("batch", ProducerConfig(delay_flush_time=-1))
    for _ in range(3):
        await producer.asend(b"x")
    assert (await api_broker.stats("default/batch")).produced == 0  # held (names: <tenant>/<name>)
    await producer.aflush()
    assert (await api_broker.stats("default/batch")).produced == 3
    timed = await acreate_stream_producer("batch", ProducerConfig(delay_flush_time=5))
    await timed.asend(b"y")
    got = await consumer.areceive(5000, expect_num=4)  # the timer flushes without an explicit flush
    assert [e.data for e in got] == [b"x", b"x", b"x", b"y"]
    await producer.aclose()
    await timed.aclose()


async def test_a_producer_flushes_at_max_elements_per_publish(api_broker):
    """A page of tiny elements is bounded by count too, not only by page_size bytes."""
    api_broker.settings = api_broker.settings.replace(max_elements_per_publish=3)
    producer = await acreate_stream_producer("count", ProducerConfig(delay_flush_time=-1))
    for _ in range(3):
        await producer.asend(b"x")
    assert (await api_broker.stats("default/count")).produced == 3
    await producer.aclose()


async def test_a_large_publish_lets_the_loop_run_between(api_broker):
    """Delivering a big batch to many subscribers yields the loop instead of holding it throughout."""
    subs = [await api_broker.subscribe("fan", buffer=10_000) for _ in range(20)]
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    ticker = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    before = turns
    await api_broker.publish("fan", elements(2000))
    ticker.cancel()
    assert turns > before
    for sub in subs:
        await sub.close()


async def test_sync_forms_work_from_threads_and_refuse_the_loop(api_broker):
    def in_thread():
        consumer = create_stream_consumer("sync", SubscriptionConfig())
        with create_stream_producer("sync", ProducerConfig(delay_flush_time=0)) as producer:
            assert query_global_producers_num("sync") == 1
            producer.send(b"a")
            producer.send("b")
        got = consumer.receive(1000, expect_num=2)
        consumer.close()
        return [e.data for e in got]

    assert await asyncio.to_thread(in_thread) == [b"a", b"b"]
    with pytest.raises(RuntimeError, match="acreate_stream_producer"):
        create_stream_producer("sync")


async def test_producer_reports_a_blocked_publish(api_broker):
    api_broker.settings = api_broker.settings.replace(subscriber_buffer=2)
    await acreate_stream_consumer("blk")
    producer = await acreate_stream_producer("blk", ProducerConfig(delay_flush_time=0, slow_consumer_policy="block"))
    await producer.asend(b"1")
    await producer.asend(b"2")
    with pytest.raises(StreamBlockedError):
        await producer.asend(b"3", timeout_ms=20)


async def test_one_tenant_cannot_fill_the_stream_limit_for_the_others():
    """streams.maxStreamsPerTenant: tenant a is refused at its share (its idle streams go first)
    while tenant b still creates streams; the message counts a's own streams only."""
    broker = MemoryBroker(BrokerSettings(max_streams=10, max_streams_per_tenant=3))
    subs = [await broker.subscribe(f"a/live-{i}") for i in range(2)]
    await broker.publish("a/idle", [b"x"])  # no subscriber: idle, reclaimed when a needs room
    subs.append(await broker.subscribe("a/live-2"))
    assert sorted(s.name for s in await broker.list()) == ["a/live-0", "a/live-1", "a/live-2"]
    with pytest.raises(StreamLimitError, match="this tenant has 3 streams"):
        await broker.subscribe("a/live-3")
    with pytest.raises(StreamLimitError):
        await broker.publish("a/more", [b"y"])
    subs.append(await broker.subscribe("b/mine"))  # another tenant is not refused
    await broker.delete("a/live-0")
    subs.append(await broker.subscribe("a/live-3"))  # room again once a deletes one
    for sub in subs:
        await sub.close()


async def test_idle_streams_are_reclaimed_at_the_stream_limit():
    """One stream per job must not fill streams.maxStreams for good; live ones are never touched."""
    broker = MemoryBroker(BrokerSettings(max_streams=3))
    live = await broker.subscribe("live")
    await broker.publish("job-1", [b"x"])  # no subscriber: dropped and counted, then idle
    await broker.publish("job-2", [b"y"])
    assert (await broker.stats("job-1")).dropped == 1  # still visible below the limit
    await broker.publish("job-3", [b"z"])  # at the limit: idle job-1 and job-2 make room
    assert sorted(s.name for s in await broker.list()) == ["job-3", "live"]
    await broker.publish("live", [b"still here"])
    assert [e.data for e in await live.next_batch()] == [b"still here"]
    await broker.subscribe("job-4")
    await broker.subscribe("job-5")  # idle job-3 makes room
    with pytest.raises(StreamLimitError):
        await broker.subscribe("job-6")  # live, job-4 and job-5 all have subscribers
    await live.close()
