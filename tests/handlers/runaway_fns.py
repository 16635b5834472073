"""Handlers that overrun their timeout, mark files, or block the event loop."""
import time
from pathlib import Path


def spin(event, context):
    """Never returns (a gentle spin: it sleeps, so the machine's two cores stay usable)."""
    while True:
        time.sleep(0.02)


def record(event, context):
    """Marks that it started (a side effect), then sleeps."""
    Path(event["mark"]).write_text("started")
    time.sleep(float(event.get("sleep", 0)))
    return "done"


async def blocks_loop(event, context):
    time.sleep(float(event.get("sleep", 1)))  # the mistake the loop-lag monitor reports
    return "slept"
