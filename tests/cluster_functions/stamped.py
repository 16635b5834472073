"""Writes `count` events `delay_ms` apart, each with the wall-clock time it was written (so a test
can tell that an event reached a reader before later ones were even produced)."""
import asyncio
import time


async def handler(event, context):
    count, delay = int(event.get("count", 5)), float(event.get("delay_ms", 100)) / 1000
    for i in range(1, count + 1):
        if i > 1:
            await asyncio.sleep(delay)
        await context.get_stream().write({"i": i, "at": time.time()})
    return {"written": count}
