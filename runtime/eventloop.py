"""Choosing the event loop (`frontend.loop`) for `fnstream serve` and `fnstream worker`.

uvloop is a dependency on Linux (see pyproject.toml), so `auto` means uvloop there; elsewhere, or
when it cannot be imported, `auto` falls back to asyncio's own loop. `uvloop` asks for it explicitly
and fails at start, with a clear message, when it is missing.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from .errors import ConfigError

__all__ = ("loop_factory", "loop_name", "run")

T = TypeVar("T")
LoopChoice = Literal["auto", "asyncio", "uvloop"]


def loop_factory(choice: LoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the chosen loop; None means asyncio's default loop."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("frontend.loop: uvloop is not installed (pip install uvloop), "
                              "or set frontend.loop to auto or asyncio") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`, for the start-up line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], choice: LoopChoice) -> T:
    """`asyncio.run(main)` on the chosen loop (asyncio.Runner: Python 3.11 has no loop_factory in run)."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
