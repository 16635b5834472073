"""runtime/tasks.py: background loops stop even when a callee swallowed their cancel (redis-py 8.1
does, about one call in ten), and an owner's wait for them is bounded."""
from __future__ import annotations

import asyncio
import logging

import pytest

from runtime.tasks import checkpoint, stop_tasks


async def _swallowing_call() -> None:
    """What redis-py sometimes does: a cancel that lands in the call is caught and dropped."""
    try:
        await asyncio.sleep(0.01)
    except asyncio.CancelledError:
        pass


async def test_a_loop_with_a_checkpoint_ends_though_its_call_swallowed_the_cancel():
    rounds = []

    async def loop() -> None:
        while True:
            await _swallowing_call()
            rounds.append(1)
            checkpoint()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert task.cancelled()


async def test_stop_tasks_asks_again_until_a_loop_without_a_checkpoint_ends():
    async def loop() -> None:   # every call swallows the cancel; the sleep between delivers the next one
        while True:
            await _swallowing_call()
            await asyncio.sleep(0.05)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.02)
    await asyncio.wait_for(stop_tasks([task], "test"), 3)
    assert task.done()


async def test_stop_tasks_gives_up_after_its_bound_and_says_so(caplog):
    released = asyncio.Event()

    async def stubborn() -> None:   # swallows every cancel, until the test lets it go
        while not released.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass

    task = asyncio.create_task(stubborn(), name="stubborn-loop")
    with caplog.at_level(logging.WARNING, logger="fnstream.runtime"):
        await asyncio.wait_for(stop_tasks([task, None], "test", timeout=0.5), 3)   # returns: no hang
    assert not task.done()
    assert "stubborn-loop" in caplog.text and "did not stop within 0.5 s" in caplog.text
    released.set()
    await asyncio.wait_for(task, 2)


async def test_a_task_that_ended_with_an_error_is_collected_quietly(caplog):
    """Its error was its own to log; stopping it must not add "Task exception was never retrieved"."""
    import gc

    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)                 # it has failed before anyone stops it
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        await stop_tasks([task], "test")
        del task
        gc.collect()
    assert "never retrieved" not in caplog.text
