"""Writes `count` events `delay_ms` apart, then returns how many it wrote.

An async handler: each `await` of the write waits while the client is slow (backpressure).
"""
import asyncio


async def handler(event, context):
    count = int(event.get("count", 5)) if isinstance(event, dict) else 5
    delay = float(event.get("delay_ms", 200)) / 1000 if isinstance(event, dict) else 0.2
    stream = context.get_stream()
    for i in range(1, count + 1):
        if i > 1 and delay > 0:
            await asyncio.sleep(delay)
        await stream.write({"tick": i, "of": count})
    return {"ticks": count}
