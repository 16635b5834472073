"""The in-process broker: fnstream's embedded default. Everything runs on the server's loop.

Memory is bounded per stream by the retention caps, and per subscription by its buffer; a
replay makes an Element of each retained entry it gives, sharing its bytes: no copy of the data.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Sequence

from .broker import AbstractBroker, AbstractSubscription, BrokerSettings, Element, StreamOptions, StreamStats
from .errors import (
    InvalidStreamIdError,
    StreamBlockedError,
    StreamDeletedError,
    StreamLimitError,
    StreamNotFoundError,
    SubscriptionCutError,
    SubscriptionEndedError,
)
from .names import MAX_QUALIFIED_NAME_LENGTH, validate_stream_name
from .retained import RetainedElements
from .tenancy import shown, tenant_of

__all__ = ("MemoryBroker", "MemorySubscription")

# Element deliveries (to the stream and each subscriber) one publish does before it yields the loop.
_WORK_PER_TURN = 4096


class MemorySubscription(AbstractSubscription):
    """A bounded buffer of live elements behind a (bounded) replay of retained ones."""

    def __init__(self, stream: _Stream, capacity: int, replay: list[Element],
                 lost: tuple[int, int] | None, start_id: int) -> None:
        self.name = stream.name
        self._stream = stream
        self.capacity = capacity
        self.max_bytes = stream.settings.subscriber_buffer_bytes  # one larger element still fits alone
        self.buffered_bytes = 0
        self._replay: deque[Element] = deque(replay)
        self._buffer: deque[Element] = deque()
        self.lost = lost
        self.last_id = start_id
        self.acked_id = start_id
        self.max_buffered = 0          # high-water mark of the live buffer (never above capacity)
        self._data = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._end: SubscriptionEndedError | None = None

    @property
    def stream_terminator(self) -> str | None:
        return self._stream.terminator

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def full(self) -> bool:
        return self._at_capacity()

    def _at_capacity(self) -> bool:
        return len(self._buffer) >= self.capacity or self.buffered_bytes >= self.max_bytes

    # -- called by the stream ------------------------------------------------------------------
    def _offer(self, element: Element) -> bool:
        if self._at_capacity():
            return False
        self._buffer.append(element)
        self.buffered_bytes += len(element.data)
        self.max_buffered = max(self.max_buffered, len(self._buffer))
        if self._at_capacity():
            self._space.clear()
        self._data.set()
        return True

    def _finish(self, error: SubscriptionEndedError) -> None:
        if self._end is None:
            self._end = error
        self._data.set()
        self._space.set()

    async def _wait_for_space(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._space.wait()
            return True
        except TimeoutError:
            return False

    # -- reader --------------------------------------------------------------------------------
    async def next_batch(self, max_items: int | None = None, timeout: float | None = None) -> list[Element]:
        while True:
            if self._replay or self._buffer:
                return self._take(max_items)
            if self._end is not None:
                err = self._end
                if isinstance(err, SubscriptionCutError):
                    # The message names the resume point, known only once the buffer is drained.
                    err = SubscriptionCutError(
                        f"stream {shown(self.name)!r}: this subscriber fell {self.capacity} elements "
                        f"(or {self.max_bytes} bytes) behind and was cut; resume after id {self.last_id} "
                        f"(Last-Event-ID: {self.last_id})",
                        last_id=self.last_id)
                raise err
            self._data.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._data.wait()
            except TimeoutError:
                return []

    def _take(self, max_items: int | None) -> list[Element]:
        limit = max_items if max_items is not None and max_items > 0 else None
        batch: list[Element] = []
        while self._replay and (limit is None or len(batch) < limit):
            batch.append(self._replay.popleft())
        while self._buffer and (limit is None or len(batch) < limit):
            element = self._buffer.popleft()
            self.buffered_bytes -= len(element.data)
            batch.append(element)
        if not self.full:
            self._space.set()
        self.last_id = batch[-1].id
        self._stream.delivered += len(batch)
        return batch

    def ack(self, ele_id: int) -> None:
        if ele_id > self.last_id:
            raise ValueError(f"cannot ack id {ele_id}: the last element received has id {self.last_id}")
        self.acked_id = max(self.acked_id, ele_id)

    async def close(self) -> None:
        self._finish(SubscriptionEndedError(f"subscription to {shown(self.name)!r} is closed", last_id=self.last_id))
        self._replay.clear()
        self._buffer.clear()
        self.buffered_bytes = 0
        self._stream.remove(self)


_NO_SUBSCRIPTIONS: frozenset[MemorySubscription] = frozenset()


class _Stream(RetainedElements):
    """One named stream: ids, live subscriptions, retention (its base's) and counters."""

    # Slots, and the lock made only when a publish may wait: every SSE invocation's kept output
    # (runtime/durable.py) is one of these, so each open stream pays for what an idle one holds.
    __slots__ = ("_publish_lock", "delivered", "dropped", "last_id", "max_stream_size", "name", "policy", "produced",
                 "producers", "retain_bytes", "retain_for_num_consumers", "retain_num", "retain_seconds", "settings",
                 "subscriptions", "subscriptions_made", "terminator")

    def __init__(self, name: str, settings: BrokerSettings) -> None:
        super().__init__()
        self.name = name
        self.settings = settings
        d = settings.defaults
        self.retain_num, self.retain_bytes, self.retain_seconds = d.retain_num, d.retain_bytes, d.retain_seconds
        self.retain_for_num_consumers = 0
        self.max_stream_size = settings.max_stream_size
        self.policy = settings.policy
        self.terminator: str | None = None
        # Made on the first subscribe: most kept invocation outputs never get a subscriber.
        self.subscriptions: set[MemorySubscription] | frozenset[MemorySubscription] = _NO_SUBSCRIPTIONS
        self.subscriptions_made = 0
        self.producers = 0
        self.last_id = 0
        self.produced = self.delivered = self.dropped = 0
        self._publish_lock: asyncio.Lock | None = None  # keeps a batch's ids together while its publish waits

    # -- settings ------------------------------------------------------------------------------
    def configure(self, o: StreamOptions) -> None:
        self.retain_num = max(self.retain_num, o.retain_num)
        self.retain_bytes = max(self.retain_bytes, o.retain_bytes)
        self.retain_seconds = max(self.retain_seconds, o.retain_seconds)
        self.retain_for_num_consumers = max(self.retain_for_num_consumers, o.retain_for_num_consumers)
        if o.max_stream_size is not None:
            self.max_stream_size = min(self.max_stream_size, o.max_stream_size)
        if o.policy is not None:
            self.policy = o.policy
        if o.terminator is not None:
            self.terminator = o.terminator
        self._evict(time.monotonic())

    @property
    def idle(self) -> bool:
        """Nothing depends on it: no subscriber, no producer, nothing kept or awaited."""
        return not (self.subscriptions or self.producers or self.retained or self._holding)

    @property
    def _holding(self) -> bool:
        """True while elements are kept for consumers still to come (retain_for_num_consumers)."""
        return self.subscriptions_made < self.retain_for_num_consumers

    @property
    def _retaining(self) -> bool:
        return bool(self.retain_num or self.retain_bytes or self.retain_seconds) or self._holding

    # -- retention -----------------------------------------------------------------------------
    def _retain(self, element: Element, now: float) -> bool:
        if not self._retaining:
            return False
        self.keep(element.id, (element.data,), now)
        self._evict(now)
        return self.retained > 0  # (evicted by its own arrival: everything before it went too)

    def _byte_limit(self) -> int:
        """The bytes retention keeps at most (while it keeps anything): the stream's cap always,
        `retain_bytes` too unless elements are held for consumers still to come."""
        if self.retain_bytes and not self._holding:
            return min(self.max_stream_size, self.retain_bytes)
        return self.max_stream_size

    def _evict(self, now: float) -> None:
        """Drop the oldest retained elements beyond the limits; the byte cap always applies."""
        num, seconds = (0, 0.0) if self._holding else (self.retain_num, self.retain_seconds)  # held: bytes only
        self.drop_oldest(now, self._byte_limit(), num, seconds, everything=not self._retaining)

    # -- publish -------------------------------------------------------------------------------
    async def publish(self, elements: Sequence[bytes], timeout: float) -> list[int]:
        if self._publish_lock is None and self.policy != "block":
            if not self.subscriptions:  # (every SSE invocation's kept output: runtime/durable.py)
                return self._append_all(elements)
            if len(elements) * (1 + len(self.subscriptions)) < _WORK_PER_TURN:
                return [self._append(data) for data in elements]  # it never waits: nothing can come between
        if self._publish_lock is None:
            self._publish_lock = asyncio.Lock()
        async with self._publish_lock:
            ids: list[int] = []
            deadline = time.monotonic() + timeout
            work = 0
            for data in elements:
                if self.policy == "block":
                    await self._wait_for_room(deadline, timeout, ids)
                ids.append(self._append(data))
                work += 1 + len(self.subscriptions)
                if work >= _WORK_PER_TURN:  # a large batch to many subscribers lets the loop run between
                    work = 0
                    await asyncio.sleep(0)
            return ids

    async def _wait_for_room(self, deadline: float, timeout: float, published: list[int]) -> None:
        while True:
            slow = next((s for s in self.subscriptions if s.full), None)
            if slow is None:
                return
            if not await slow._wait_for_space(max(0.0, deadline - time.monotonic())):
                done = f"; ids {published[0]}..{published[-1]} were published" if published else ""
                raise StreamBlockedError(
                    f"stream {shown(self.name)!r}: a subscriber has not read its {slow.capacity} buffered elements; "
                    f"the producer waited {timeout:g} s and gave up "
                    f"(policy 'block'){done}", published=published)

    def _append_all(self, elements: Sequence[bytes]) -> list[int]:
        """Publish a batch no subscriber waits for: ids, retention and eviction once for the batch
        (element by element, `_append` costs microseconds an event; this, a C-level pass)."""
        ids = list(range(self.last_id + 1, self.last_id + 1 + len(elements)))
        self.last_id += len(elements)
        self.produced += len(elements)
        if not self._retaining or not elements:
            self.dropped += len(elements)
            return ids
        now = time.monotonic()
        self.keep(ids[0], elements, now)
        most = self._byte_limit()
        if max(map(len, elements)) > most:  # kept by none: evicted by its own arrival, as `_append` counts
            self.dropped += sum(1 for data in elements if len(data) > most)
        self._evict(now)
        return ids

    def _append(self, data: bytes) -> int:
        now = time.monotonic()
        self.last_id += 1
        element = Element(data, self.last_id)
        self.produced += 1
        reached = 0
        for sub in list(self.subscriptions):
            if sub._offer(element):
                reached += 1
            else:  # only under 'cut': 'block' made room first
                self.remove(sub)
                sub._finish(SubscriptionCutError("cut", last_id=sub.last_id))
        if not self._retain(element, now) and not reached:
            self.dropped += 1
        return element.id

    # -- subscribe -----------------------------------------------------------------------------
    def subscribe(self, from_id: int | None, capacity: int) -> MemorySubscription:
        if len(self.subscriptions) >= self.settings.max_subscribers:
            raise StreamLimitError(f"stream {shown(self.name)!r} already has {len(self.subscriptions)} subscribers "
                                   f"(streams.maxSubscribersPerStream)")
        now = time.monotonic()
        self._evict(now)
        lost = None
        if from_id is None:
            replay = self.kept_after(0) if self._holding else []
            start = replay[0].id - 1 if replay else self.last_id
        else:
            if from_id < 0 or from_id > self.last_id:
                raise InvalidStreamIdError(f"stream {shown(self.name)!r}: id {from_id} is out of range; "
                                           f"ids so far are 1..{self.last_id}")
            first_kept = self.first_kept_id() or self.last_id + 1
            if from_id + 1 < first_kept:
                lost = (from_id + 1, first_kept - 1)
            replay = self.kept_after(from_id)
            start = from_id
        sub = MemorySubscription(self, capacity, replay, lost, start)
        if isinstance(self.subscriptions, frozenset):
            self.subscriptions = set()
        self.subscriptions.add(sub)
        self.subscriptions_made += 1
        self._evict(now)  # the last consumer awaited by retain_for_num_consumers releases the hold
        return sub

    def remove(self, sub: MemorySubscription) -> None:
        if isinstance(self.subscriptions, set):
            self.subscriptions.discard(sub)

    def stats(self) -> StreamStats:
        self._evict(time.monotonic())
        return StreamStats(
            name=self.name, producers=self.producers, consumers=len(self.subscriptions),
            produced=self.produced, delivered=self.delivered, dropped=self.dropped, last_id=self.last_id,
            first_retained_id=self.first_kept_id(), retained=self.retained, retained_bytes=self.retained_bytes,
            policy=self.policy, terminator=self.terminator)


class MemoryBroker(AbstractBroker):
    """Named streams in this process. Call it on the server's event loop only."""

    def __init__(self, settings: BrokerSettings | None = None) -> None:
        self.settings = settings or BrokerSettings()
        self._streams: dict[str, _Stream] = {}
        self._of_tenant: Counter[str] = Counter()  # streams per tenant (the qualified name's prefix)

    def _get(self, name: str) -> _Stream:
        stream = self._streams.get(validate_stream_name(name, MAX_QUALIFIED_NAME_LENGTH))
        if stream is None:
            raise StreamNotFoundError(f"stream {shown(name)!r} does not exist")
        return stream

    def _get_or_create(self, name: str) -> _Stream:
        stream = self._streams.get(validate_stream_name(name, MAX_QUALIFIED_NAME_LENGTH))
        if stream is None:
            tenant = tenant_of(name)
            settings = self.settings
            if len(self._streams) >= settings.max_streams or self._of_tenant[tenant] >= settings.max_streams_per_tenant:
                self._reclaim_idle()
            if self._of_tenant[tenant] >= settings.max_streams_per_tenant:
                raise StreamLimitError(f"cannot create stream {shown(name)!r}: this tenant has "
                                       f"{self._of_tenant[tenant]} streams (streams.maxStreamsPerTenant); "
                                       f"delete some first")
            if len(self._streams) >= settings.max_streams:
                raise StreamLimitError(f"cannot create stream {shown(name)!r}: {len(self._streams)} streams exist "
                                       f"(streams.maxStreams); delete some first")
            stream = self._streams[name] = _Stream(name, settings)
            self._of_tenant[tenant] += 1
        return stream

    def _forget(self, name: str) -> None:
        del self._streams[name]
        tenant = tenant_of(name)
        self._of_tenant[tenant] -= 1
        if not self._of_tenant[tenant]:
            del self._of_tenant[tenant]

    def _reclaim_idle(self) -> None:
        """At a stream limit, forget idle streams (only their counters go), so names used once
        (one stream per job) do not fill `streams.maxStreams` for good."""
        for name in [n for n, s in self._streams.items() if s.idle]:
            self._forget(name)

    async def publish(self, name: str, elements: Sequence[bytes], *, timeout: float | None = None) -> list[int]:
        self.check_elements(elements)
        stream = self._get_or_create(name)
        return await stream.publish(elements, self.settings.block_timeout if timeout is None else timeout)

    async def subscribe(self, name: str, *, from_id: int | None = None,
                        buffer: int | None = None) -> MemorySubscription:
        created = validate_stream_name(name, MAX_QUALIFIED_NAME_LENGTH) not in self._streams
        stream = self._get_or_create(name)
        try:
            return stream.subscribe(from_id, buffer or self.settings.subscriber_buffer)
        except Exception:
            if created and self._streams.get(name) is stream:  # a refused subscription leaves nothing behind
                self._forget(name)
            raise

    async def configure(self, name: str, options: StreamOptions) -> None:
        self._get_or_create(name).configure(options)

    async def attach_producer(self, name: str, options: StreamOptions | None = None) -> None:
        stream = self._get_or_create(name)
        if options is not None:
            stream.configure(options)
        stream.producers += 1

    async def detach_producer(self, name: str) -> None:
        stream = self._streams.get(name)
        if stream is not None:
            stream.producers = max(0, stream.producers - 1)

    async def stats(self, name: str) -> StreamStats:
        return self._get(name).stats()

    async def list(self) -> list[StreamStats]:
        return [self._streams[n].stats() for n in sorted(self._streams)]

    async def delete(self, name: str) -> None:
        stream = self._get(name)
        self._forget(name)
        for sub in list(stream.subscriptions):
            sub._finish(StreamDeletedError(f"stream {shown(name)!r} was deleted", last_id=sub.last_id))
        stream.subscriptions = _NO_SUBSCRIPTIONS

    async def close(self) -> None:
        for name in list(self._streams):
            await self.delete(name)
