"""Waiting for the process's stop signal, shared by `fnstream serve` and `fnstream worker`."""
from __future__ import annotations

import asyncio
import signal

__all__ = ("wait_for_stop_signal",)


async def wait_for_stop_signal() -> None:
    """Return once SIGINT or SIGTERM arrives; the previous handlers are restored."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
