"""RunPod-style handlers: `def handler(job)` (one parameter) gets the job dict and no context.

The adapter wraps such a handler into the `handler(event, context)` shape of the same kind
(sync, `async def`, generator, async generator), so everything else treats it as any handler.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

__all__ = ("adapt_handler", "takes_one_parameter")


def takes_one_parameter(func: Callable[..., Any]) -> bool:
    """True for `def handler(job)`: exactly one positional parameter and no `*args`."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: call them as (event, context)
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 1 and not any(p.kind == p.VAR_POSITIONAL for p in params)


def adapt_handler(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` itself, or for a one-parameter handler a two-parameter wrapper of the same kind."""
    if not takes_one_parameter(func):
        return func
    if inspect.isasyncgenfunction(func):
        async def async_gen(event: Any, context: Any) -> AsyncIterator[Any]:
            async for item in func(event):
                yield item
        wrapper: Callable[..., Any] = async_gen
    elif inspect.iscoroutinefunction(func):
        async def coroutine(event: Any, context: Any) -> Any:
            return await func(event)
        wrapper = coroutine
    elif inspect.isgeneratorfunction(func):
        def gen(event: Any, context: Any) -> Generator[Any, Any, Any]:
            return (yield from func(event))
        wrapper = gen
    else:
        def sync(event: Any, context: Any) -> Any:
            return func(event)
        wrapper = sync
    functools.update_wrapper(wrapper, func)
    del wrapper.__wrapped__  # type: ignore[attr-defined]  # inspect.signature must see (event, context)
    wrapper.runpod_style = True  # type: ignore[attr-defined]
    return wrapper
