"""Handlers for the process-executor tests: each one exercises one thing a worker must survive."""
import asyncio
import ctypes
import os
import sys
import time
from pathlib import Path

INIT_PID = None


def init(context):
    global INIT_PID
    INIT_PID = os.getpid()


def pid(event, context):
    return {"pid": os.getpid(), "init_pid": INIT_PID, "echo": event}


def env(event, context):
    """A worker's process environment, as RunPod workers read their settings (os.getenv)."""
    return {k: os.environ.get(k) for k in event["keys"]}


def ticker(event, context):
    """Plain def: `count` writes `delay_ms` apart with time.sleep (blocking, in the worker)."""
    count, delay = int(event.get("count", 5)), float(event.get("delay_ms", 200)) / 1000
    stream = context.get_stream()
    for i in range(1, count + 1):
        if i > 1:
            time.sleep(delay)
        stream.write({"tick": i, "of": count})
    return {"ticks": count}


async def aticker(event, context):
    count, delay = int(event.get("count", 5)), float(event.get("delay_ms", 200)) / 1000
    for i in range(1, count + 1):
        if i > 1:
            await asyncio.sleep(delay)
        await context.get_stream().write({"tick": i})
    return {"ticks": count, "pid": os.getpid()}


def gen(event, context):
    for i in range(int(event.get("count", 3))):
        yield {"i": i}


def sleeper(event, context):
    time.sleep(float(event.get("seconds", 0)))
    return {"slept": event.get("seconds", 0), "pid": os.getpid()}


def until_cancelled(event, context):
    """Writes until `limit` (forever by default); records in `marker` that it was interrupted
    (the finally block ran)."""
    marker = Path(event["marker"])
    try:
        i, limit = 0, event.get("limit")
        while limit is None or i < limit:
            i += 1
            context.get_stream().write({"i": i})
            time.sleep(0.05)
        return i
    finally:
        marker.write_text(str(os.getpid()))


def stubborn(event, context):
    """Ignores cancellation: must be killed after the grace period (`ok` returns at once)."""
    if event.get("ok"):
        return "ok"
    context.get_stream().write("started")
    while True:
        try:
            time.sleep(60)
        except BaseException:
            pass


def big_writer(event, context):
    """`count` writes of `size` bytes; `progress` records how many were accepted so far."""
    progress = Path(event["progress"])
    blob = "x" * int(event["size"])
    for i in range(1, int(event["count"]) + 1):
        context.get_stream().write(blob)
        progress.write_text(str(i))
    return "done"


def hog(event, context):
    data = bytearray(int(event["mb"]) * 1024 * 1024)
    return len(data)


def crash(event, context):
    how = event["how"]
    if how == "sys.exit":
        sys.exit(3)
    if how == "os._exit":
        os._exit(7)
    if how == "segfault":
        ctypes.string_at(0)
    raise ValueError("boom from the handler")


def cpu(event, context):
    """Waits (bounded) until `n` invocations have started, then burns CPU; returns its pid."""
    barrier = Path(event["barrier"])
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 10
    while len(list(barrier.iterdir())) < int(event.get("n", 2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    total = 0
    for i in range(int(event.get("loops", 2_000_000))):
        total += i * i
    return {"pid": os.getpid(), "total": total}


def pre_stop(context):
    marker = context.getUserData("marker") or os.environ.get("FNSTREAM_TEST_PRESTOP")
    if marker:
        Path(marker).write_text(f"preStop {os.getpid()}")


def unhurried_pre_stop(context):
    """Takes `preStopSeconds` (a preStop with work to do), then says it finished in `marker`."""
    time.sleep(float(context.getUserData("preStopSeconds")))
    Path(context.getUserData("marker")).write_text(f"finished {os.getpid()}")


def hanging_pre_stop(context):
    """Never returns by itself: the worker must give up on it after min(timeout, 180 s)."""
    Path(context.getUserData("marker")).write_text(f"hanging {os.getpid()}")
    while True:
        time.sleep(1)


def last_words(event, context):
    """Writes, then dies at once: the writes made just before must still reach the client."""
    stream = context.get_stream()
    for i in range(int(event.get("n", 3))):
        stream.write(f"word {i}")
    os._exit(9)


def logs_as_another(event, context):
    """Claims another function's and invocation's log context, then logs (hostile code in a worker)."""
    import logging

    from runtime.logs import set_log_context

    set_log_context("0" * 31 + "1", "someone-else", "f" * 32)
    logging.getLogger("user.code").warning("who am I")
    return {"pid": os.getpid()}


def logs(event, context):
    """Logs through the context's logger, a plain module logger, and with a traceback (def handler)."""
    import logging

    context.getLogger().info("process handler says hello")
    logging.getLogger("user.code").warning("a plain logger in worker %d", os.getpid())
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        logging.getLogger("user.code").exception("caught it")
    return {"pid": os.getpid()}


async def alogs(event, context):
    """The async handler's logs."""
    import logging

    await asyncio.sleep(0)
    logging.getLogger("user.async").info("async handler says hello")
    return {"pid": os.getpid()}


def logs_and_fails(event, context):
    """The worker itself logs the traceback of a handler that raises."""
    raise RuntimeError("the process handler failed")
