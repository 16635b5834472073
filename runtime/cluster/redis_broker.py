"""Named streams as Redis Streams, so a subscriber on one node gets what a producer on another writes.

Element ids are the memory broker's 1, 2, 3... and the Redis entry id of element N is `0-N`
(a Lua script takes the next number and appends atomically, so ids stay in order across
producers); the SSE `id:` a client resumes from is that same number. Each subscriber reads with
blocking XREAD from its own position, so fan-out, order and `Last-Event-ID` resume come from
Redis itself. Memory is bounded by the publish script's trim (the `retainNum` newest, else at
most `subscriberBuffer` elements and `subscriberBufferBytes` bytes), and each read returns at most
that many elements and bytes (one larger element alone): a subscriber that falls further behind
than the bound finds a gap and is cut with the id to resume after, as under the memory broker's
'cut' policy ('block' is refused: a producer cannot see how far behind subscribers on other nodes are).
The meta hash keeps the counters the memory broker reports, updated by the same scripts that
append (produced, dropped, retained_bytes) and read (delivered).
Keys are hash-tagged by stream name: `{stream:NAME}:s` (entries) and `{stream:NAME}:meta`; both
expire after `streams.idleStreamSeconds` without a publish or a waiting subscriber.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Any

from redis.typing import EncodableT, FieldT

from runtime.errors import BadRequestError, FunctionServiceError
from runtime.streams.broker import (
    AbstractBroker,
    AbstractSubscription,
    BrokerSettings,
    Element,
    StreamOptions,
    StreamStats,
)
from runtime.streams.errors import (
    InvalidStreamIdError,
    StreamDeletedError,
    StreamNotFoundError,
    SubscriptionCutError,
    SubscriptionEndedError,
)
from runtime.streams.names import MAX_QUALIFIED_NAME_LENGTH, validate_stream_name
from runtime.streams.tenancy import shown

from ..tasks import checkpoint
from .settings import REDIS_DOWN, AnyRedis, ClusterUnavailableError

__all__ = ("RedisBroker", "RedisSubscription")

# KEYS: entries, meta; ARGV: maxlen, idle ms (0: keep for ever), window bytes, then the elements.
# Returns the first id given.
# Trims itself so it can take the trimmed elements' bytes off retained_bytes: beyond the
# `retain_num` newest, it keeps at most `maxlen` elements and `window bytes` bytes (at least the
# newest one), the bound a slow subscriber may fall behind before it is cut (subscriberBuffer,
# subscriberBufferBytes). An element published with no subscriber and no retention asked for
# counts as dropped.
_PUBLISH = """
local n = #ARGV - 3
local first = redis.call('HINCRBY', KEYS[2], 'seq', n) - (n - 1)
local bytes = 0
for i = 4, #ARGV do
  redis.call('XADD', KEYS[1], '0-' .. (first + i - 4), 'd', ARGV[i])
  bytes = bytes + #ARGV[i]
end
local len = redis.call('XLEN', KEYS[1])
local kept = tonumber(redis.call('HGET', KEYS[2], 'retained_bytes') or '0') + bytes
local retain = tonumber(redis.call('HGET', KEYS[2], 'retain_num') or '0')
local maxlen, window = tonumber(ARGV[1]), tonumber(ARGV[3])
local cap = tonumber(redis.call('HGET', KEYS[2], 'max_stream_size') or '0')
local function over()
  return len > maxlen or (len > retain and len > 1 and kept > window) or (cap > 0 and len > 1 and kept > cap)
end
local dropped, cursor = 0, '-'
while over() do
  local oldest = redis.call('XRANGE', KEYS[1], cursor, '+', 'COUNT', 64)
  if #oldest == 0 then break end
  for _, entry in ipairs(oldest) do
    if not over() then break end
    kept = kept - #entry[2][2]
    bytes = bytes - #entry[2][2]
    len = len - 1
    dropped = dropped + 1
    cursor = '(' .. entry[1]
  end
end
if dropped > 0 then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', len)
end
redis.call('HINCRBY', KEYS[2], 'retained_bytes', bytes)
redis.call('HINCRBY', KEYS[2], 'produced', n)
local consumers = tonumber(redis.call('HGET', KEYS[2], 'consumers') or '0')
if consumers <= 0 and retain == 0 then
  redis.call('HINCRBY', KEYS[2], 'dropped', n)
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return first
"""
# KEYS: meta; ARGV: field, increment. A counter of a stream that still exists (a late update
# must not bring a deleted stream's meta back). Returns the terminator, for readers.
_COUNT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
end
return redis.call('HGET', KEYS[1], 'terminator')
"""
_POLL = 1.0   # seconds a blocking read waits before checking the stream still exists


def _seq(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2])


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, str):
        return value or None
    return value.decode("utf-8", "replace") if value else None


def _within(max_bytes: int, batch: list[Element]) -> list[Element]:
    """The first elements of `batch` that fit in `max_bytes` (at least one); the rest are read again next time."""
    total = 0
    for i, element in enumerate(batch):
        total += len(element.data)
        if total > max_bytes and i > 0:
            return batch[:i]
    return batch


class RedisSubscription(AbstractSubscription):
    """A position in one Redis stream; reads never hold more than `capacity` elements."""

    def __init__(self, broker: RedisBroker, name: str, start_id: int, capacity: int,
                 lost: tuple[int, int] | None, terminator: str | None) -> None:
        self._broker = broker
        self.name = name
        self.last_id = start_id
        self.acked_id = start_id
        self.capacity = capacity
        self.max_bytes = broker.settings.subscriber_buffer_bytes  # one larger element still passes alone
        self.lost = lost
        self._terminator = terminator
        self._closed = False

    @property
    def stream_terminator(self) -> str | None:
        return self._terminator

    async def next_batch(self, max_items: int | None = None, timeout: float | None = None) -> list[Element]:
        try:
            return await self._next_batch(max_items, timeout)
        except FunctionServiceError:
            raise  # cut, deleted, closed (some are ConnectionErrors, hence OSErrors: not "Redis down")
        except REDIS_DOWN as exc:  # any Redis call of the read (xread, counters, meta)
            raise ClusterUnavailableError(f"stream {shown(self.name)!r}: Redis unreachable ({exc}); "
                                          f"resume after id {self.last_id}") from None

    async def _next_batch(self, max_items: int | None, timeout: float | None) -> list[Element]:
        if self._closed:
            raise SubscriptionEndedError(f"subscription to {shown(self.name)!r} is closed", last_id=self.last_id)
        count = min(self.capacity, max_items) if max_items and max_items > 0 else self.capacity
        deadline = None if timeout is None else time.monotonic() + timeout
        keys = self._broker.keys(self.name)
        while True:
            poll = self._broker.poll_seconds
            wait = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            try:
                reply: Any = await self._broker.redis.xread({keys[0]: f"0-{self.last_id}"}, count=count,
                                                       block=max(1, int(wait * 1000)))
            except REDIS_DOWN as exc:
                raise ClusterUnavailableError(f"stream {shown(self.name)!r}: Redis unreachable ({exc}); "
                                              f"resume after id {self.last_id}") from None
            checkpoint()  # the subscriber left while the read ran: its cancel must not be lost in redis-py
            if reply:
                entries = reply[0][1]
                if _seq(entries[0][0]) > self.last_id + 1:
                    raise SubscriptionCutError(
                        f"stream {shown(self.name)!r}: this subscriber fell more than the stream's bound behind and "
                        f"was cut; resume after id {self.last_id} (Last-Event-ID: {self.last_id})",
                        last_id=self.last_id)
                batch = _within(self.max_bytes, [Element(fields[b"d"], _seq(eid)) for eid, fields in entries])
                # Count them as delivered; a producer may also have agreed a terminator after we subscribed.
                terminator = await self._broker.count(self.name, "delivered", len(batch))
                self._terminator = self._terminator or terminator
                self.last_id = batch[-1].id
                return batch
            meta: Any = await self._broker.redis.hmget(keys[1], "seq", "terminator")
            if meta[0] is None:
                raise StreamDeletedError(f"stream {shown(self.name)!r} was deleted", last_id=self.last_id)
            await self._broker.touch(self.name)
            self._terminator = _text(meta[1])
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def ack(self, ele_id: int) -> None:
        if ele_id > self.last_id:
            raise ValueError(f"cannot ack id {ele_id}: the last element received has id {self.last_id}")
        self.acked_id = max(self.acked_id, ele_id)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                await self._broker.count(self.name, "consumers", -1)
            except (ClusterUnavailableError, *REDIS_DOWN):
                pass


class RedisBroker(AbstractBroker):
    """The AbstractBroker over Redis Streams (cluster mode)."""

    def __init__(self, redis: AnyRedis, prefix: str, settings: BrokerSettings | None = None) -> None:
        self.redis = redis            # a client without decode_responses: elements are bytes
        self.prefix = prefix
        self.settings = settings or BrokerSettings()
        self.index = f"{prefix}:streams"
        # Streams forget themselves after this long without a publish or a waiting subscriber, so
        # names used once (one stream per job) do not accumulate in Redis.
        self._idle_ms = int(self.settings.idle_seconds * 1000)
        # A waiting subscriber re-arms that expiry at each poll, well before it could pass.
        self.poll_seconds = min(_POLL, self.settings.idle_seconds / 3) if self._idle_ms else _POLL
        self._publish = redis.register_script(_PUBLISH)
        self._count = redis.register_script(_COUNT)

    def keys(self, name: str) -> tuple[str, str]:
        return f"{self.prefix}:{{stream:{name}}}:s", f"{self.prefix}:{{stream:{name}}}:meta"

    async def _call(self, coro: Awaitable[Any]) -> Any:
        """A Redis reply (its shape depends on the command), or ClusterUnavailableError."""
        try:
            return await coro
        except REDIS_DOWN as exc:
            raise ClusterUnavailableError(f"named streams need Redis, which is unreachable: {exc}") from None

    async def count(self, name: str, field: str, by: int) -> str | None:
        """Add `by` to a counter of the stream (if it still exists); returns its terminator."""
        return _text(await self._call(self._count(keys=[self.keys(name)[1]], args=[field, by])))

    async def _ensure(self, name: str, terminator: str | None = None) -> tuple[str, str]:
        keys = self.keys(validate_stream_name(name, MAX_QUALIFIED_NAME_LENGTH))
        # Idempotent steps, so no transaction (the index and the stream are on different cluster slots).
        async with self.redis.pipeline(transaction=False) as pipe:
            if terminator is not None:  # first: whoever sees the stream exist sees how it ends (find_shared)
                pipe.hset(keys[1], "terminator", terminator)
            pipe.hsetnx(keys[1], "seq", 0)
            pipe.hsetnx(keys[1], "retain_num", self.settings.defaults.retain_num)
            pipe.sadd(self.index, name)
            if self._idle_ms:
                pipe.pexpire(keys[1], self._idle_ms)
            await self._call(pipe.execute())
        return keys

    async def touch(self, name: str) -> None:
        """A subscriber still waits on the stream: keep it from being forgotten as idle."""
        if self._idle_ms:
            keys = self.keys(name)
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.pexpire(keys[0], self._idle_ms)
                pipe.pexpire(keys[1], self._idle_ms)
                await self._call(pipe.execute())

    async def _maxlen(self, meta: str) -> int:
        retain = int(await self._call(self.redis.hget(meta, "retain_num")) or 0)
        return max(retain, self.settings.subscriber_buffer)

    async def publish(self, name: str, elements: Sequence[bytes], *, timeout: float | None = None) -> list[int]:
        self.check_elements(elements)
        if not elements:
            return []
        keys = await self._ensure(name)
        maxlen = await self._maxlen(keys[1])
        args: list[bytes | int] = [maxlen, self._idle_ms, self.settings.subscriber_buffer_bytes, *elements]
        first = int(await self._call(self._publish(keys=list(keys), args=args)))
        return list(range(first, first + len(elements)))

    async def subscribe(self, name: str, *, from_id: int | None = None, buffer: int | None = None) -> RedisSubscription:
        keys = await self._ensure(name)
        seq_text, terminator = await self._call(self.redis.hmget(keys[1], "seq", "terminator"))
        last = int(seq_text or 0)
        lost = None
        if from_id is None:
            start = last
        else:
            if from_id < 0 or from_id > last:
                raise InvalidStreamIdError(f"stream {shown(name)!r}: id {from_id} is out of range; "
                                           f"ids so far are 1..{last}")
            first = await self._call(self.redis.xrange(keys[0], count=1))
            first_kept = _seq(first[0][0]) if first else last + 1
            if from_id + 1 < first_kept:
                lost = (from_id + 1, first_kept - 1)
                from_id = first_kept - 1   # replay what is left, then live
            start = from_id
        await self._call(self.redis.hincrby(keys[1], "consumers", 1))
        return RedisSubscription(self, name, start, buffer or self.settings.subscriber_buffer, lost, _text(terminator))

    async def configure(self, name: str, options: StreamOptions) -> None:
        if options.policy == "block":
            raise BadRequestError(f"stream {shown(name)!r}: slow-subscriber policy 'block' is not offered in "
                                  "cluster mode (a producer cannot see subscribers on other nodes); use 'cut'")
        keys = await self._ensure(name, options.terminator)
        current, cap = await self._call(self.redis.hmget(keys[1], "retain_num", "max_stream_size"))
        fields: dict[FieldT, EncodableT] = {"retain_num": max(int(current or 0), options.retain_num)}
        if options.max_stream_size is not None:  # a cap on retained bytes only lowers, as the memory broker's
            fields["max_stream_size"] = min(int(cap or options.max_stream_size), options.max_stream_size)
        await self._call(self.redis.hset(keys[1], mapping=fields))

    async def attach_producer(self, name: str, options: StreamOptions | None = None) -> None:
        if options is not None:
            await self.configure(name, options)
        keys = await self._ensure(name)
        await self._call(self.redis.hincrby(keys[1], "producers", 1))

    async def detach_producer(self, name: str) -> None:
        await self.count(name, "producers", -1)

    async def stats(self, name: str) -> StreamStats:
        keys = self.keys(validate_stream_name(name, MAX_QUALIFIED_NAME_LENGTH))
        raw = await self._call(self.redis.hgetall(keys[1]))
        meta = {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}
        if not meta:
            raise StreamNotFoundError(f"stream {shown(name)!r} does not exist")
        length = await self._call(self.redis.xlen(keys[0]))
        first = await self._call(self.redis.xrange(keys[0], count=1))
        return StreamStats(
            name=name, producers=max(0, int(meta.get("producers", 0))), consumers=max(0, int(meta.get("consumers", 0))),
            produced=int(meta.get("produced", 0)), delivered=int(meta.get("delivered", 0)),
            dropped=int(meta.get("dropped", 0)), last_id=int(meta.get("seq", 0)),
            first_retained_id=_seq(first[0][0]) if first else None, retained=length,
            retained_bytes=int(meta.get("retained_bytes", 0)),
            policy="cut", terminator=meta.get("terminator") or None)

    async def list(self) -> list[StreamStats]:
        out = []
        for name in sorted(n.decode() for n in await self._call(self.redis.smembers(self.index))):
            try:
                out.append(await self.stats(name))
            except StreamNotFoundError:
                await self._call(self.redis.srem(self.index, name))
        return out

    async def delete(self, name: str) -> None:
        keys = self.keys(validate_stream_name(name, MAX_QUALIFIED_NAME_LENGTH))
        removed = await self._call(self.redis.delete(*keys))
        await self._call(self.redis.srem(self.index, name))
        if not removed:
            raise StreamNotFoundError(f"stream {shown(name)!r} does not exist")

    async def close(self) -> None:
        await self.redis.aclose()
