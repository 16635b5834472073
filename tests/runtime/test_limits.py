"""Waiters: FIFO wake-ups for the function thread gate and session turns, never losing room."""
from __future__ import annotations

import asyncio
import logging

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


def test_a_stall_spent_waiting_for_a_cpu_is_the_hosts_and_blames_no_function(caplog):
    from runtime.limits import LoopLagMonitor
    monitor = LoopLagMonitor(lambda: [])
    with caplog.at_level(logging.WARNING, logger="fnstream.runtime"):
        monitor.record(1.2, [], waited=1.0)  # ready to run, no CPU given: a busy host
        assert monitor.host_stalls == 1 and monitor.stalls == 0
        assert "the host was busy" in caplog.text and "async def" not in caplog.text
        caplog.clear()
        monitor.record(1.2, ["blocker"], waited=0.01)  # the loop ran (or slept in) a handler's code
        assert monitor.stalls == 1 and "blocker" in caplog.text and "async def" in caplog.text
        caplog.clear()
        monitor.record(1.2, [], waited=0.0)  # no handler ran: not one to name
        assert monitor.stalls == 2 and "no handler ran" in caplog.text and "async def" not in caplog.text
        caplog.clear()
        # Waiting for a CPU and running on one: the loop's own work (a huge body parsed on it), a busy
        # host only made it longer; not the host's.
        monitor.record(2.4, [], waited=1.3, ran=1.1)
        assert monitor.stalls == 3 and "the host was busy" not in caplog.text
        assert "1.10s of it on a CPU" in caplog.text and "1.30s waiting" in caplog.text
    assert monitor.describe()["hostStalls"] == 1
