"""The invocation surface: what every invocation shows, wherever it runs.

Three kinds of invocation exist: a local `Invocation` (runtime/invocation.py), a
`RemoteInvocation` relayed from a cluster worker (runtime/cluster/queue.py) and the invocation
a process worker runs (runtime/process/child/). They share `InvocationInfo`. A handler sees
its invocation through `HandlerInvocation` (what `Context` needs); a response reads one through
`InvocationSurface`, so each response kind (JSON, SSE, OpenAI chunks...) is written once for
local and cluster invocations alike.
"""
from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import asyncio

    from .channel import OutputChannel
    from .manifest import FunctionSpec

__all__ = ("Mode", "resolve_mode", "InvocationInfo", "HandlerStream", "HandlerInvocation", "InvocationSurface",
           "PooledInvocation")

# json: one JSON answer; sse: each write is one event; raw: the handler frames its own SSE.
Mode = Literal["json", "sse", "raw"]


def resolve_mode(requested: Mode, spec: FunctionSpec) -> Mode:
    """The mode an invocation runs in: SSE of a `rawStream` function is passed through raw."""
    return "raw" if requested == "sse" and spec.rawStream else requested


class InvocationInfo(Protocol):
    """What every invocation shows."""

    @property
    def id(self) -> str: ...
    @property
    def trace_id(self) -> str: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def started(self) -> float: ...  # time.monotonic() when it began

    def remaining(self) -> float:
        """Seconds left before its deadline."""
        ...

    def cancel(self, reason: str) -> None:
        """Stop it: its writes raise StreamClosedError, its handler is interrupted."""
        ...


class HandlerStream(Protocol):
    """`context.get_stream()`: each write is one event (await it in async handlers)."""

    max_write_size: int

    def write(self, data: Any) -> Awaitable[None]: ...
    def set_max_write_size(self, size: int) -> None: ...


class HandlerInvocation(InvocationInfo, Protocol):
    """What `Context` gives a handler: the invocation, its output stream and its X-Instance-Session."""

    @property
    def stream(self) -> HandlerStream: ...
    @property
    def session_id(self) -> str | None: ...  # the X-Instance-Session's sessionID, if any
    @property
    def session_restarted(self) -> bool: ...  # the session's earlier instance died before this turn


class InvocationSurface(InvocationInfo, Protocol):
    """What a response reads: output batches, then the outcome."""

    @property
    def spec(self) -> FunctionSpec: ...
    @property
    def channel(self) -> OutputChannel[str]: ...  # read side: get_batch() until it returns []
    @property
    def max_response_size(self) -> int: ...
    @property
    def streaming(self) -> bool: ...  # mode != "json"

    def outcome(self) -> Awaitable[Any]:
        """The handler's return value, or the FunctionServiceError it ended with."""
        ...

    async def encoded_result(self) -> str | None:
        """The answer as JSON text, bounded by `max_response_size` (a generator's items for a plain
        JSON call); None when nothing follows the stream (a streaming call that returned None, or raw)."""
        ...


class PooledInvocation(HandlerInvocation, Protocol):
    """What a process pool needs of the local invocation it runs on a worker (runtime/process/pool.py):
    the event to send, and where the worker's writes (its output channel, filled on the loop) and
    generator items go."""

    @property
    def event(self) -> Any: ...
    @property
    def channel(self) -> OutputChannel[str]: ...
    @property
    def streaming(self) -> bool: ...
    @property
    def max_write_size(self) -> int: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def keep_items(self) -> bool: ...  # a streaming one's generator items reach the channel as values (a job's)

    def add_item_blocking(self, item: Any) -> None: ...
