"""Handlers for the instance tests: many invocations per worker, scaling and sessions."""
import asyncio
import os
import time
from pathlib import Path

TURNS: dict = {}      # per session id: the turns this worker process has seen (in-memory state)
ACTIVE: dict = {}     # per session id: invocations running now
PEAK: dict = {}       # per session id: the most that ever ran at once


async def nap(event, context):
    await asyncio.sleep(float(event.get("seconds", 1)))
    return {"pid": os.getpid()}


def rendezvous(event, context):
    """Plain def: waits (bounded) until `n` invocations have arrived in `dir`; says whether they all did."""
    here = Path(event["dir"])
    (here / f"{os.getpid()}-{context.get_invoke_id()}").touch()
    deadline = time.monotonic() + float(event.get("limit", 10))
    while len(list(here.iterdir())) < int(event["n"]):
        if time.monotonic() > deadline:
            return {"pid": os.getpid(), "met": False}
        time.sleep(0.01)
    return {"pid": os.getpid(), "met": True}


def chunked_sleep(event, context):
    """Plain def that sleeps in small steps (a cancel stops it at the next step)."""
    deadline = time.monotonic() + float(event.get("seconds", 1))
    if event.get("stream"):
        context.get_stream().write("started")
    while time.monotonic() < deadline:
        time.sleep(0.02)
    return {"pid": os.getpid()}


def stubborn_or_sleep(event, context):
    """`stubborn`: ignores cancellation until killed; otherwise a long chunked sleep."""
    if not event.get("stubborn"):
        return chunked_sleep(event, context)
    context.get_stream().write("started")
    while True:
        try:
            time.sleep(60)
        except BaseException:  # the point of this handler
            pass


async def remember(event, context):
    """Keeps the turns of each session in this process's memory; `crash` kills the process."""
    sid = context.session_id
    if event.get("crash"):
        os._exit(9)
    TURNS.setdefault(sid, []).append(event.get("say"))
    ACTIVE[sid] = ACTIVE.get(sid, 0) + 1
    PEAK[sid] = max(PEAK.get(sid, 0), ACTIVE[sid])
    try:
        await asyncio.sleep(float(event.get("seconds", 0)))
    finally:
        ACTIVE[sid] -= 1
    return {"pid": os.getpid(), "session": sid, "turns": TURNS[sid], "peak": PEAK[sid],
            "restarted": context.session_restarted}


async def chatter(event, context):
    """Streams forever (an LLM answer that never ends), until cancelled."""
    i = 0
    while True:
        i += 1
        await context.get_stream().write({"i": i})
        await asyncio.sleep(0.05)


async def flood(event, context):
    """`count` writes of `size` bytes, awaited (backpressure), then "done"."""
    blob = "x" * int(event.get("size", 1000))
    for _ in range(int(event["count"])):
        await context.get_stream().write(blob)
    return "done"
