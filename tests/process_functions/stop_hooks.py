"""preStop of in-process (thread and async) functions: each hook appends one line to `marker`.

The marker file and a tag come from the manifest's `environment`, so a test can tell which
revision ran what, and in which order.
"""
import asyncio
import time
from pathlib import Path


def _note(context, what: str) -> None:
    with Path(context.getUserData("marker")).open("a") as f:
        f.write(f"{what} {context.getUserData('tag', '-')}\n")


def handler(event, context):
    """Sleep `seconds`, or until the file `until` exists (a test's release, no clock involved)."""
    if event.get("until"):
        deadline = time.monotonic() + 60
        while not Path(event["until"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        time.sleep(float(event.get("seconds", 0)))
    if event.get("seconds") or event.get("until"):
        _note(context, "invocation-end")
    return {"tag": context.getUserData("tag")}


async def ahandler(event, context):
    await asyncio.sleep(float(event.get("seconds", 0)))
    return {"tag": context.getUserData("tag")}


def pre_stop(context):
    _note(context, "preStop")


async def apre_stop(context):
    await asyncio.sleep(0)
    _note(context, "apreStop")


def broken_pre_stop(context):
    raise RuntimeError("preStop blew up")


def slow_pre_stop(context):
    _note(context, "slow-preStop-started")
    time.sleep(60)
