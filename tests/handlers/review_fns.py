"""Handlers for tests/test_review_findings.py."""
import asyncio
import time


async def unawaited_writes(event, context):
    """Writes `n` events without awaiting (allowed: a write to a full buffer is refused at the next write)."""
    stream = context.get_stream()
    for i in range(int(event.get("n", 3))):
        stream.write(f"e{i}")
    return "done"


def sync_burst_then_sleep(event, context):
    for i in range(int(event.get("n", 5))):
        context.get_stream().write(f"e{i}")
    time.sleep(float(event.get("sleep", 2)))
    return "late"


async def async_slow(event, context):
    await asyncio.sleep(float(event.get("sleep", 5)))
    return "late"


def echo(event, context):
    return event


async def raises_cancelled(event, context):
    """User code that lets a CancelledError of its own escape (e.g. awaiting a task someone cancelled)."""
    if event.get("write"):
        await context.get_stream().write("first")
    inner = asyncio.get_running_loop().create_future()
    inner.cancel()
    await inner


async def fanout(event, context):
    """Two coroutines of one handler, each awaiting every write (asyncio.gather)."""
    n = int(event.get("n", 5))

    async def writer(tag):
        for i in range(n):
            await context.get_stream().write(f"{tag}{i}")

    await asyncio.gather(writer("a"), writer("b"))
    return "done"
