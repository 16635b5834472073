"""OutputChannel: the bounded queue between a handler's writes and the response that reads them."""
from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.channel import OutputChannel
from runtime.errors import StreamClosedError


async def test_the_reader_gets_everything_queued_in_order_in_one_batch() -> None:
    channel: OutputChannel[str] = OutputChannel(asyncio.get_running_loop(), 10)
    for i in range(4):
        assert channel.try_put(f"e{i}")
    assert len(channel) == 4
    assert await channel.get_batch() == ["e0", "e1", "e2", "e3"]
    assert len(channel) == 0


async def test_try_put_refuses_beyond_capacity_until_the_reader_drains() -> None:
    channel: OutputChannel[int] = OutputChannel(asyncio.get_running_loop(), 3)
    assert [channel.try_put(i) for i in range(4)] == [True, True, True, False]
    assert await channel.get_batch() == [0, 1, 2]
    assert channel.try_put(3)


async def test_a_waiting_reader_is_woken_by_a_write_from_a_thread() -> None:
    channel: OutputChannel[str] = OutputChannel(asyncio.get_running_loop(), 2)
    reading = asyncio.ensure_future(channel.get_batch())
    await asyncio.sleep(0.01)
    assert not reading.done()
    await asyncio.to_thread(channel.put_blocking, "from a thread")
    assert await asyncio.wait_for(reading, 5) == ["from a thread"]


async def test_close_lets_the_reader_drain_then_gives_an_empty_batch_and_refuses_writes() -> None:
    channel: OutputChannel[str] = OutputChannel(asyncio.get_running_loop(), 5)
    channel.try_put("last")
    channel.close()
    assert await channel.get_batch() == ["last"]
    assert await channel.get_batch() == []
    with pytest.raises(StreamClosedError, match="the invocation has finished"):
        channel.try_put("late")


async def test_an_interrupted_reader_gets_timeout_and_the_channel_stays_usable() -> None:
    channel: OutputChannel[str] = OutputChannel(asyncio.get_running_loop(), 5)
    assert not channel.interrupt_reader()  # nobody waits: nothing to wake
    reader = asyncio.ensure_future(channel.get_batch())
    await asyncio.sleep(0)
    assert channel.interrupt_reader()
    with pytest.raises(TimeoutError):
        await reader
    channel.try_put("after the heartbeat")
    assert await channel.get_batch() == ["after the heartbeat"]
    reader = asyncio.ensure_future(channel.get_batch())
    await asyncio.sleep(0)
    channel.try_put("queued first")  # the reader was woken with it: a later interrupt is too late
    assert not channel.interrupt_reader()
    assert await reader == ["queued first"]


async def test_take_and_ready_read_without_a_coroutine_and_miss_no_write() -> None:
    """The SSE relay's read: take() what is there (None: nothing yet), else await ready()."""
    channel: OutputChannel[str] = OutputChannel(asyncio.get_running_loop(), 5)
    assert channel.take() is None
    waiting = channel.ready()
    assert not waiting.done()
    await asyncio.to_thread(channel.try_put, "from a thread")
    await asyncio.wait_for(waiting, 10)
    assert channel.take() == ["from a thread"]
    assert channel.take() is None
    channel.try_put("came between take() and ready()")
    assert channel.ready().done()  # no wait for what is already there
    assert channel.take() == ["came between take() and ready()"]
    interrupted = channel.ready()
    assert channel.interrupt_reader()
    with pytest.raises(TimeoutError):
        await interrupted
    channel.close()
    assert channel.ready().done()
    assert channel.take() == []


async def test_put_blocking_waits_while_full_backpressure() -> None:
    channel: OutputChannel[int] = OutputChannel(asyncio.get_running_loop(), 2)
    done = threading.Event()

    def writer() -> None:
        for i in range(5):
            channel.put_blocking(i, timeout=10)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    got: list[int] = []
    try:
        while len(got) < 5:
            batch = await asyncio.wait_for(channel.get_batch(), 10)
            assert len(batch) <= 2  # never more than the capacity is held
            got.extend(batch)
    finally:
        await asyncio.to_thread(thread.join, 10)
    assert got == [0, 1, 2, 3, 4]
    assert done.is_set()


async def test_put_blocking_times_out_when_nobody_reads() -> None:
    channel: OutputChannel[int] = OutputChannel(asyncio.get_running_loop(), 1)
    channel.try_put(0)
    with pytest.raises(StreamClosedError, match="timed out: the client is not reading"):
        await asyncio.to_thread(channel.put_blocking, 1, 0.05)


async def test_async_put_awaits_room() -> None:
    channel: OutputChannel[int] = OutputChannel(asyncio.get_running_loop(), 1)
    await channel.put(0)
    waiting = asyncio.ensure_future(channel.put(1))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    assert await channel.get_batch() == [0]
    await asyncio.wait_for(waiting, 5)
    assert await channel.get_batch() == [1]


async def test_cancel_discards_wakes_every_writer_and_keeps_the_first_reason() -> None:
    channel: OutputChannel[int] = OutputChannel(asyncio.get_running_loop(), 1)
    channel.try_put(0)
    async_writer = asyncio.ensure_future(channel.put(1))
    thread_writer = asyncio.ensure_future(asyncio.to_thread(channel.put_blocking, 2, 10))
    await asyncio.sleep(0.05)
    channel.cancel("the client disconnected")
    channel.cancel("a later reason")
    assert channel.cancel_reason == "the client disconnected"
    for writer in (async_writer, thread_writer):
        with pytest.raises(StreamClosedError, match="stream closed: the client disconnected"):
            await asyncio.wait_for(writer, 5)
    assert await channel.get_batch() == []  # discarded: the reader is gone


async def test_cancel_without_discard_still_hands_over_what_was_written() -> None:
    """The deadline passed but the client is there: it gets what was written before the error."""
    channel: OutputChannel[str] = OutputChannel(asyncio.get_running_loop(), 5)
    channel.try_put("before the deadline")
    channel.cancel("timed out", discard=False)
    with pytest.raises(StreamClosedError, match="timed out"):
        channel.try_put("after")
    assert await channel.get_batch() == ["before the deadline"]
    assert await channel.get_batch() == []


async def test_cancel_wakes_a_waiting_reader() -> None:
    channel: OutputChannel[str] = OutputChannel(asyncio.get_running_loop(), 5)
    reading = asyncio.ensure_future(channel.get_batch())
    await asyncio.sleep(0.01)
    await asyncio.to_thread(channel.cancel, "gone")
    assert await asyncio.wait_for(reading, 5) == []


async def test_try_put_many_takes_what_fits_by_count_and_bytes_in_order() -> None:
    loop = asyncio.get_running_loop()
    by_count: OutputChannel[str] = OutputChannel(loop, 3)
    assert by_count.try_put("a")
    assert by_count.try_put_many(["b", "c", "d"]) == 2  # room for two more
    assert by_count.try_put_many(["d"]) == 0
    assert await by_count.get_batch() == ["a", "b", "c"]
    by_bytes: OutputChannel[str] = OutputChannel(loop, 100, max_bytes=5)
    assert by_bytes.try_put_many(["xx", "yy", "zz"]) == 2  # 2 + 2 bytes fit, 6 would not
    assert by_bytes.queued_bytes == 4
    assert await by_bytes.get_batch() == ["xx", "yy"]
    assert by_bytes.try_put_many(["a much longer write"]) == 1  # alone, one larger item still passes
    by_bytes.close()
    with pytest.raises(StreamClosedError):
        by_bytes.try_put_many(["late"])
