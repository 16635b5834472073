"""The handler-facing stream API, with openYuanrong's names.

`create_stream_producer(name, ProducerConfig)` / `create_stream_consumer(name, SubscriptionConfig)`,
`delete_stream`, `query_global_producers_num`, `query_global_consumers_num`. Every call has a sync
form for thread handlers (it runs the work on the server's loop and waits) and an async form,
prefixed `a` (`await producer.asend(...)`), for async handlers: a sync call made on the loop
itself would deadlock, so it raises a RuntimeError naming the async form.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from typing import Any, Literal, TypeVar

from .broker import AbstractBroker, AbstractSubscription, Element, StreamOptions
from .errors import StreamError, StreamNotFoundError, SubscriptionEndedError
from .names import validate_stream_name
from .tenancy import qualify, scoped_tenant

__all__ = (
    "Element", "ProducerConfig", "SubscriptionConfig", "SubscriptionType", "Producer", "Consumer",
    "bind_broker", "unbind_broker", "current_broker",
    "create_stream_producer", "create_stream_consumer", "delete_stream",
    "query_global_producers_num", "query_global_consumers_num",
    "acreate_stream_producer", "acreate_stream_consumer", "adelete_stream",
    "aquery_global_producers_num", "aquery_global_consumers_num",
)

T = TypeVar("T")

_lock = threading.Lock()
_bound: tuple[AbstractBroker, asyncio.AbstractEventLoop] | None = None


def bind_broker(broker: AbstractBroker, loop: asyncio.AbstractEventLoop) -> None:
    """Make `broker` (served on `loop`) the one the module functions use; done by the server at start."""
    global _bound
    with _lock:
        _bound = (broker, loop)


def unbind_broker(broker: AbstractBroker) -> None:
    global _bound
    with _lock:
        if _bound is not None and _bound[0] is broker:
            _bound = None


def current_broker() -> tuple[AbstractBroker, asyncio.AbstractEventLoop]:
    bound = _bound
    if bound is None:
        raise RuntimeError("no stream broker: named streams are available inside a running fnstream server")
    return bound


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _run_sync(loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[T]], async_name: str,
              timeout: float | None = None) -> T:
    """Run the coroutine `make()` on `loop` from another thread and wait for its result."""
    if _on_loop(loop):
        raise RuntimeError(f"this is the blocking form, called on the event loop: in an async handler "
                           f"use `await ...{async_name}(...)`")
    future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(_as_coroutine(make()), loop)
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise


def _to_bytes(element: Any) -> bytes:
    if isinstance(element, Element):
        return element.data
    if isinstance(element, (bytes, bytearray, memoryview, str)):
        return Element(element).data
    raise TypeError(f"send() takes an Element, bytes or str, not {type(element).__name__}")


@dataclass
class ProducerConfig:
    """openYuanrong's producer settings, in its order (so positional arguments mean what they mean
    there), then fnstream's retention and slow-subscriber policy, keyword-only."""

    delay_flush_time: int = 5            # ms: <0 flush only on flush()/close()/full page; 0 at once
    page_size: int = 1024 * 1024         # bytes buffered before a flush is forced
    max_stream_size: int = 1024 * 1024 * 1024  # cap on retained bytes (lowers streams.maxStreamSize)
    auto_clean_up: bool = False          # accepted for compatibility; streams live until deleted
    encrypt_stream: bool = False         # accepted for compatibility; elements stay in this process
    retain_for_num_consumers: int = 0    # keep everything until this many consumers subscribed
    reserve_size: int = 0                # accepted for compatibility
    extend_config: dict[str, Any] = field(default_factory=dict[str, Any])
    _: KW_ONLY
    retain_num: int = 0                  # keep the last N elements for late / reconnecting readers
    retain_bytes: int = 0                # ... or the last B bytes
    retain_seconds: float = 0.0          # ... or S seconds' worth
    slow_consumer_policy: Literal["block", "cut"] | None = None  # None: streams.slowConsumerPolicy
    terminator: str | None = None        # the stream's agreed terminator, for REST subscribers

    def options(self) -> StreamOptions:
        return StreamOptions(retain_num=self.retain_num, retain_bytes=self.retain_bytes,
                             retain_seconds=self.retain_seconds,
                             retain_for_num_consumers=self.retain_for_num_consumers,
                             max_stream_size=self.max_stream_size, policy=self.slow_consumer_policy,
                             terminator=self.terminator)


class SubscriptionType(Enum):
    """openYuanrong's subscription types; only STREAM is served (as in openYuanrong itself)."""

    STREAM = 0
    ROUND_ROBIN = 1
    KEY_PARTITIONS = 2


@dataclass
class SubscriptionConfig:
    """openYuanrong's subscription settings in its order (`SubscriptionConfig("name")` works as
    there), then fnstream's resume id and buffer size, keyword-only. `subscriptionType` takes the
    enum or its name."""

    subscription_name: str = ""
    subscriptionType: SubscriptionType | str = SubscriptionType.STREAM
    extend_config: dict[str, Any] = field(default_factory=dict[str, Any])
    _: KW_ONLY
    from_id: int | None = None           # replay retained elements with id > from_id first
    buffer: int | None = None            # elements; None: streams.subscriberBuffer

    def __post_init__(self) -> None:
        kind = self.subscriptionType
        name = kind.name if isinstance(kind, SubscriptionType) else kind
        if name != "STREAM":
            raise ValueError(f"subscriptionType {name!r} is not supported; only STREAM")
        self.subscriptionType = SubscriptionType.STREAM


class Producer:
    """Sends elements into one named stream; buffers up to `delay_flush_time` ms / `page_size` bytes."""

    def __init__(self, broker: AbstractBroker, loop: asyncio.AbstractEventLoop, name: str,
                 config: ProducerConfig, *, key: str | None = None) -> None:
        self.name = name              # the caller's name for the stream
        self._key = key or name       # the broker's (tenant-qualified) name
        self.config = config
        self._broker = broker
        self._loop = loop
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._flush_lock = asyncio.Lock()
        self._error: BaseException | None = None  # from a timed flush; raised at the next call
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise StreamError(f"producer of {self.name!r} is closed")
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    async def asend(self, element: Element | bytes | str, timeout_ms: int | None = None) -> None:
        self._check()
        data = _to_bytes(element)
        if len(data) > self._broker.settings.max_element_size or not data:
            self._broker.check_elements([data])
        self._pending.append(data)
        self._pending_bytes += len(data)
        delay = self.config.delay_flush_time
        if (delay == 0 or self._pending_bytes >= self.config.page_size
                or len(self._pending) >= self._broker.settings.max_elements_per_publish):
            await self._flush(timeout_ms)
        elif delay > 0 and self._timer is None:
            self._timer = self._loop.call_later(delay / 1000, self._timed_flush)

    def _timed_flush(self) -> None:
        self._timer = None
        task = self._loop.create_task(self._flush(None))
        task.add_done_callback(self._keep_error)

    def _keep_error(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._error = task.exception()

    async def _flush(self, timeout_ms: int | None) -> None:
        async with self._flush_lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            if batch:
                timeout = None if timeout_ms is None else timeout_ms / 1000
                await self._broker.publish(self._key, batch, timeout=timeout)

    async def aflush(self) -> None:
        self._check()
        await self._flush(None)

    async def aclose(self) -> None:
        """Flush what is buffered and detach; idempotent."""
        if self._closed:
            return
        try:
            await self._flush(None)
        finally:
            self._closed = True
            await self._broker.detach_producer(self._key)
        self._check_error_after_close()

    def _check_error_after_close(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def send(self, element: Element | bytes | str, timeout_ms: int | None = None) -> None:
        _run_sync(self._loop, lambda: self.asend(element, timeout_ms), "asend")

    def flush(self) -> None:
        _run_sync(self._loop, self.aflush, "aflush")

    def close(self) -> None:
        _run_sync(self._loop, self.aclose, "aclose")

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Consumer:
    """Receives the elements of one named stream, in order."""

    def __init__(self, subscription: AbstractSubscription, loop: asyncio.AbstractEventLoop,
                 config: SubscriptionConfig, *, name: str | None = None) -> None:
        self._sub = subscription
        self._loop = loop
        self.name = subscription.name if name is None else name  # the caller's name, never the broker's
        self.config = config
        self.lost: tuple[int, int] | None = subscription.lost

    async def areceive(self, timeout_ms: int, expect_num: int | None = None) -> list[Element]:
        """Up to `expect_num` elements (any number if None), returning early once that many came.

        Waits at most `timeout_ms`; returns [] when nothing arrived. Raises
        SubscriptionEndedError (cut, deleted, closed) once nothing is left to read.
        """
        if expect_num is not None and expect_num < 1:
            raise ValueError(f"expect_num must be >= 1, got {expect_num}")
        got: list[Element] = []
        deadline = self._loop.time() + max(0, timeout_ms) / 1000
        while True:
            want = None if expect_num is None else expect_num - len(got)
            try:
                batch = await self._sub.next_batch(want, max(0.0, deadline - self._loop.time()))
            except SubscriptionEndedError:
                if got:
                    return got  # the error is raised again by the next receive
                raise
            got.extend(batch)
            if not batch or expect_num is None or len(got) >= expect_num:
                return got

    async def aack(self, element_id: int) -> None:
        self._sub.ack(element_id)

    async def aclose(self) -> None:
        """Ack what was received and leave the stream; idempotent."""
        self._sub.ack(self._sub.last_id)
        await self._sub.close()

    def receive(self, timeout_ms: int, expect_num: int | None = None) -> list[Element]:
        return _run_sync(self._loop, lambda: self.areceive(timeout_ms, expect_num), "areceive")

    def ack(self, element_id: int) -> None:
        """openYuanrong's parameter name (`ack(element_id=...)` works as there)."""
        _run_sync(self._loop, lambda: self.aack(element_id), "aack")

    def close(self) -> None:
        _run_sync(self._loop, self.aclose, "aclose")

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- module functions (openYuanrong's `yr.*` names) --------------------------------------------
def _scoped(broker: AbstractBroker, stream_name: str) -> str:
    """The broker's name for the caller's stream: qualified with the running invocation's tenant
    (runtime/streams/tenancy.py), unless the broker's other side qualifies (a worker's proxy)."""
    if broker.scoped_remotely:
        return validate_stream_name(stream_name)
    return qualify(scoped_tenant(), stream_name)


async def acreate_stream_producer(stream_name: str, config: ProducerConfig | None = None) -> Producer:
    broker, _loop = current_broker()
    return await _create_producer(stream_name, _scoped(broker, stream_name), config)


async def _create_producer(name: str, key: str, config: ProducerConfig | None) -> Producer:
    broker, loop = current_broker()
    config = config or ProducerConfig()
    await broker.attach_producer(key, config.options())
    return Producer(broker, loop, name, config, key=key)


async def acreate_stream_consumer(stream_name: str, config: SubscriptionConfig | None = None) -> Consumer:
    broker, _loop = current_broker()
    return await _create_consumer(stream_name, _scoped(broker, stream_name), config)


async def _create_consumer(name: str, key: str, config: SubscriptionConfig | None) -> Consumer:
    broker, loop = current_broker()
    config = config or SubscriptionConfig()
    sub = await broker.subscribe(key, from_id=config.from_id, buffer=config.buffer)
    return Consumer(sub, loop, config, name=name)


async def adelete_stream(stream_name: str) -> None:
    broker = current_broker()[0]
    await broker.delete(_scoped(broker, stream_name))


async def aquery_global_producers_num(stream_name: str) -> int:
    return await _count(_scoped(current_broker()[0], stream_name), "producers")


async def aquery_global_consumers_num(stream_name: str) -> int:
    return await _count(_scoped(current_broker()[0], stream_name), "consumers")


async def _count(name: str, what: str) -> int:
    try:
        stats = await current_broker()[0].stats(name)
    except StreamNotFoundError:
        return 0
    count: int = getattr(stats, what)
    return count


# The blocking forms qualify the name here, in the handler's thread, where its tenant is known.
def create_stream_producer(stream_name: str, config: ProducerConfig | None = None) -> Producer:
    broker, loop = current_broker()
    key = _scoped(broker, stream_name)
    return _run_sync(loop, lambda: _create_producer(stream_name, key, config), "acreate_stream_producer")


def create_stream_consumer(stream_name: str, config: SubscriptionConfig | None = None) -> Consumer:
    broker, loop = current_broker()
    key = _scoped(broker, stream_name)
    return _run_sync(loop, lambda: _create_consumer(stream_name, key, config), "acreate_stream_consumer")


def delete_stream(stream_name: str) -> None:
    broker, loop = current_broker()
    name = _scoped(broker, stream_name)
    _run_sync(loop, lambda: broker.delete(name), "adelete_stream")


def query_global_producers_num(stream_name: str) -> int:
    broker, loop = current_broker()
    name = _scoped(broker, stream_name)
    return _run_sync(loop, lambda: _count(name, "producers"), "aquery_global_producers_num")


def query_global_consumers_num(stream_name: str) -> int:
    broker, loop = current_broker()
    name = _scoped(broker, stream_name)
    return _run_sync(loop, lambda: _count(name, "consumers"), "aquery_global_consumers_num")
