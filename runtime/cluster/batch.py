"""One pipeline per loop turn: the Redis commands every invocation needs now, in one round trip.

A round trip (pack, one send, one receive, a task wake-up) costs far more of a node's CPU than
Redis spends on the command, so commands issued in the same event-loop turn — the enqueues of
the requests that arrived together, the answers and acks of the invocations that finished
together — go out as one non-transactional pipeline, in the order they were issued (so an
answer is stored before its queue entry is acked). Each caller awaits its own reply; a command's
error is its caller's alone.
"""
from __future__ import annotations

import asyncio
from typing import Any

from redis.typing import EncodableT

from .settings import AnyRedis

__all__ = ("Batcher",)


class Batcher:
    """Queues commands and sends every command queued in one loop turn as one pipeline."""

    def __init__(self, redis: AnyRedis) -> None:
        self.redis = redis
        self._queued: list[tuple[tuple[EncodableT, ...], asyncio.Future[Any]]] = []
        self._flushing: set[asyncio.Task[None]] = set()

    def call(self, *args: EncodableT) -> asyncio.Future[Any]:
        """Queue one command (name, then its arguments); the future gets its reply or its error."""
        loop = asyncio.get_running_loop()
        if not self._queued:
            loop.call_soon(self._flush)
        future: asyncio.Future[Any] = loop.create_future()
        self._queued.append((args, future))
        return future

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        task = asyncio.ensure_future(self._send(batch))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _send(self, batch: list[tuple[tuple[EncodableT, ...], asyncio.Future[Any]]]) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for args, _ in batch:
                    pipe.execute_command(*args)
                replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:   # the connection failed: every caller of this batch gets it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue   # its caller was cancelled
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)
