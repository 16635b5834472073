"""One bounded wait for the tests: poll until something is so, or fail saying what never was.

A wait for readiness (a worker up, a job finished, a slot freed), never a timing assertion: the
limit only bounds how long a broken run takes to fail, and is generous for a loaded machine.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ("eventually",)


def _truthy(value: Any) -> bool:
    return bool(value)


async def eventually(probe: Callable[[], Any | Awaitable[Any]], what: str = "the condition", *,
                     limit: float = 20.0, step: float = 0.05, accept: Callable[[Any], bool] = _truthy) -> Any:
    """Call `probe()` (a plain or an async function) every `step` seconds until `accept` takes its
    value (by default: the value is truthy), and return that value. After `limit` seconds, fail
    with an AssertionError naming `what` and the last value seen."""
    deadline = time.monotonic() + limit
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if accept(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up waiting for {what} after {limit:g} s (last: {value!r})")
        await asyncio.sleep(step)
