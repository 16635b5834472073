"""Test handlers for cluster mode: each event says which process produced it."""
import asyncio
import os


async def handler(event, context):
    """Waits `wait_ms`, then writes `count` events `delay_ms` apart, each with this process's pid."""
    await asyncio.sleep(float(event.get("wait_ms", 0)) / 1000)
    count = int(event.get("count", 3))
    for i in range(1, count + 1):
        if i > 1:
            await asyncio.sleep(float(event.get("delay_ms", 100)) / 1000)
        await context.get_stream().write({"i": i, "pid": os.getpid()})
    return {"count": count, "pid": os.getpid()}


def gen(event, context):
    """A plain generator: in a JSON request its items are the result."""
    yield from range(int(event.get("count", 3)))


async def counted(event, context):
    """A job (RunPod's `{"input": ...}`) that appends its `n` to the file `log` as it starts (one
    line per execution: a job run twice shows twice), writes `{"n", "i": 1}`, waits `wait_ms`, then
    writes `i` 2 and 3 and returns `n`."""
    job = event.get("input", event)
    with open(job["log"], "a") as log:
        log.write(f"{job['n']}\n")
    await context.get_stream().write({"n": job["n"], "i": 1})
    await asyncio.sleep(float(job.get("wait_ms", 0)) / 1000)
    for i in (2, 3):
        await context.get_stream().write({"n": job["n"], "i": i})
    return job["n"]
