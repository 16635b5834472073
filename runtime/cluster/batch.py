"""One pipeline per loop turn: the Redis commands every invocation needs now, in one round trip.

A round trip (pack, one send, one receive, a task wake-up) costs far more of a node's CPU than
Redis spends on the command, so commands issued in the same event-loop turn — the enqueues of
the requests that arrived together, the answers and acks of the invocations that finished
together — go out as one non-transactional pipeline, in the order they were issued (so an
answer is stored before its queue entry is acked). Each caller awaits its own reply; a command's
error is its caller's alone.

Variadic commands that need no order among themselves (XACK and XDEL of one queue, DEL) are
merged: `merge` adds its arguments to the loop turn's one command of that head, sent after every
other command of the pipeline (so an entry's ack still follows its answer), and each caller awaits
that command's reply. The worker's ack of N entries finished together is one XACK and one XDEL, the
frontend's DEL of N answered calls' keys one DEL.

On a single Redis server over TCP the batches go out on a connection of the Batcher's own
(lean.py: one write, replies parsed as they come, no redis-py pipeline), retried after a lost
connection as redis-py's client retries (twice, 0.05 then 0.1 s later); on a Redis Cluster, or
TLS, as redis-py pipelines.
"""
from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from .lean import lean_for
from .settings import AnyRedis

__all__ = ("Batcher",)

# A command queued: its arguments, the futures of its callers (more than one: merged).
_Queued = tuple[tuple[EncodableT, ...], list[asyncio.Future[Any]]]


class Batcher:
    """Queues commands and sends every command queued in one loop turn as one pipeline."""

    def __init__(self, redis: AnyRedis) -> None:
        self.redis = redis
        self._queued: list[_Queued] = []
        # (slot, head: command name and fixed arguments) -> its arguments so far, its callers' futures
        self._merged: dict[tuple[int, tuple[EncodableT, ...]], tuple[list[EncodableT], list[asyncio.Future[Any]]]] = {}
        self._flushing: set[asyncio.Task[None]] = set()
        self._lean = lean_for(redis)

    async def close(self) -> None:
        """Closes the Batcher's own connection, if it has one (the client's pool is the caller's)."""
        if self._lean is not None:
            await self._lean.close()

    def call(self, *args: EncodableT) -> asyncio.Future[Any]:
        """Queue one command (name, then its arguments); the future gets its reply or its error."""
        loop = asyncio.get_running_loop()
        if not self._queued and not self._merged:
            loop.call_soon(self._flush)
        future: asyncio.Future[Any] = loop.create_future()
        self._queued.append((args, [future]))
        return future

    def merge(self, head: tuple[EncodableT, ...], *args: EncodableT, slot: int = 0) -> asyncio.Future[Any]:
        """Add `args` to this loop turn's command `head` (e.g. ("XACK", key, group)), queued last;
        the future gets that command's reply (or error), as every other caller merged into it does.
        `slot`: the Redis Cluster slot of the keys in `args` (settings.slot_of), if any: a command's
        keys must share one, so only those of one slot are merged."""
        loop = asyncio.get_running_loop()
        merged = self._merged.get((slot, head))
        if merged is None:
            if not self._queued and not self._merged:
                loop.call_soon(self._flush)
            merged = self._merged[slot, head] = ([], [])
        future: asyncio.Future[Any] = loop.create_future()
        merged[0].extend(args)
        merged[1].append(future)
        return future

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        batch += [((*head, *args), futures) for (_, head), (args, futures) in self._merged.items()]
        self._merged = {}
        task = asyncio.ensure_future(self._send(batch))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _send(self, batch: list[_Queued]) -> None:
        replies: list[Any]
        try:
            if self._lean is not None:
                replies = await self._lean_send([args for args, _ in batch])
            elif len(batch) == 1:   # alone in its loop turn: a plain command costs the client less than a
                try:              # pipeline of one (~45 µs less CPU on this node; the same retry)
                    replies = [await self.redis.execute_command(*batch[0][0])]
                except ResponseError as exc:   # its error, as a pipeline returns it
                    replies = [exc]
            else:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for args, _ in batch:
                        pipe.execute_command(*args)
                    replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:   # the connection failed: every caller of this batch gets it
            for _, futures in batch:
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, futures), reply in zip(batch, replies, strict=True):
            for future in futures:
                if future.done():
                    continue   # its caller was cancelled
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def _lean_send(self, commands: list[tuple[EncodableT, ...]]) -> list[Any]:
        assert self._lean is not None
        for attempt in range(3):
            try:
                return await self._lean.send(commands)
            except (RedisConnectionError, RedisTimeoutError):
                if attempt == 2:
                    raise
                await asyncio.sleep(0.05 * 2 ** attempt)
        raise AssertionError("unreachable")
