"""Waiters: FIFO wake-ups for the function thread gate and session turns, never losing room."""
from __future__ import annotations

import asyncio

from runtime.limits import Waiters


async def test_waiters_wake_in_order_and_a_cancelled_wakeup_passes_on():
    waiters, room, order = Waiters(), [0], []

    async def take(name: str) -> None:
        await waiters.wait_while(lambda: room[0] == 0)
        room[0] -= 1
        order.append(name)

    tasks = [asyncio.create_task(take(n)) for n in "abc"]
    await asyncio.sleep(0)
    assert waiters and not order
    room[0] = 1
    waiters.wake_one()        # wakes a ...
    tasks[0].cancel()         # ... which is cancelled before it runs: b must get the room
    await asyncio.sleep(0.01)
    assert order == ["b"] and tasks[0].cancelled()
    room[0] = 1
    waiters.wake_one()
    await asyncio.wait_for(tasks[2], 5)
    assert order == ["b", "c"] and not waiters
