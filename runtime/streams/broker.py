"""The broker interface behind named streams, and the value types every implementation shares.

Semantics every broker keeps (the memory broker is the reference, a Redis-Streams broker can
follow it): per-stream sequence ids 1, 2, 3...; fan-out to every subscription of elements
produced after it subscribed, in order; an element that reaches no subscription and no retention
is dropped and counted; `subscribe(from_id=N)` replays retained elements with id > N then goes
live with no gap and no duplicate, and reports ids it can no longer replay in `lost`; each
subscription's buffer is bounded and a full one either blocks producers (policy "block", up to
a timeout) or cuts the subscriber (policy "cut") with an error naming the id to resume after.
"""
from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import ElementTooLargeError, InvalidElementError

if TYPE_CHECKING:
    from runtime.config import StreamsConfig

__all__ = (
    "Element",
    "Policy",
    "StreamOptions",
    "BrokerSettings",
    "StreamStats",
    "AbstractSubscription",
    "AbstractBroker",
)

Policy = Literal["block", "cut"]


class Element:
    """One stream element: bytes `data` and its sequence `id` (0 until published)."""

    __slots__ = ("data", "id")

    def __init__(self, value: bytes | bytearray | memoryview | str, ele_id: int = 0) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        elif not isinstance(value, bytes):
            raise TypeError(f"an element is bytes, bytearray, memoryview or str, not {type(value).__name__}")
        self.data: bytes = value
        self.id: int = int(ele_id)

    @property
    def value(self) -> bytes:
        return self.data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Element) and other.data == self.data and other.id == self.id

    def __hash__(self) -> int:
        return hash((self.id, self.data))

    def __repr__(self) -> str:
        shown = self.data if len(self.data) <= 40 else self.data[:40] + b"..."
        return f"Element({shown!r}, ele_id={self.id})"


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOptions:
    """Per-stream settings a producer (or a REST publisher) may ask for.

    Retention only widens: each limit becomes the larger of what is set and what is asked, so
    one producer cannot take away what another relies on. `None` leaves a setting unchanged.
    """

    retain_num: int = 0             # keep the last N elements (0: no count-based retention)
    retain_bytes: int = 0           # keep the last B bytes
    retain_seconds: float = 0.0     # keep elements for S seconds
    retain_for_num_consumers: int = 0  # keep everything until this many subscriptions were made
    max_stream_size: int | None = None  # hard cap on retained bytes (lowers the broker's cap)
    policy: Policy | None = None    # slow-subscriber policy of the stream
    terminator: str | None = None   # the stream's agreed terminator (for REST subscribers)

    def __post_init__(self) -> None:
        for field in ("retain_num", "retain_bytes", "retain_seconds", "retain_for_num_consumers"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)!r}")
        if self.max_stream_size is not None and self.max_stream_size < 1:
            raise ValueError(f"max_stream_size must be >= 1, got {self.max_stream_size!r}")
        if self.policy not in (None, "block", "cut"):
            raise ValueError(f"policy must be 'block' or 'cut', got {self.policy!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerSettings:
    """Broker-wide limits and defaults (from the `streams:` config section)."""

    subscriber_buffer: int = 1000
    subscriber_buffer_bytes: int = 4 * 1024 * 1024  # bytes a subscription may hold or fall behind (both brokers)
    policy: Policy = "cut"
    block_timeout: float = 5.0
    defaults: StreamOptions = StreamOptions()
    max_stream_size: int = 64 * 1024 * 1024
    max_element_size: int = 4 * 1024 * 1024
    max_elements_per_publish: int = 10000
    max_streams: int = 10000
    max_streams_per_tenant: int = 5000  # memory broker: one tenant's share of max_streams
    max_subscribers: int = 10000
    idle_seconds: float = 86400.0  # Redis broker: forget a stream with no activity this long (0 = never)

    @classmethod
    def from_config(cls, cfg: StreamsConfig) -> BrokerSettings:
        """From a `runtime.config.StreamsConfig`."""
        return cls(
            subscriber_buffer=cfg.subscriberBuffer,
            subscriber_buffer_bytes=cfg.subscriberBufferBytes,
            policy=cfg.slowConsumerPolicy,
            block_timeout=cfg.blockTimeoutMs / 1000,
            defaults=StreamOptions(retain_num=cfg.retainNum, retain_bytes=cfg.retainBytes,
                                   retain_seconds=cfg.retainSeconds),
            max_stream_size=cfg.maxStreamSize,
            max_element_size=cfg.maxElementSize,
            max_elements_per_publish=cfg.maxElementsPerPublish,
            max_streams=cfg.maxStreams,
            max_streams_per_tenant=cfg.maxStreamsPerTenant,
            max_subscribers=cfg.maxSubscribersPerStream,
            idle_seconds=cfg.idleStreamSeconds,
        )

    def replace(self, **changes: Any) -> BrokerSettings:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class StreamStats:
    name: str
    producers: int
    consumers: int
    produced: int
    delivered: int
    dropped: int
    last_id: int
    first_retained_id: int | None
    retained: int
    retained_bytes: int
    policy: Policy
    terminator: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class AbstractSubscription(abc.ABC):
    """One subscriber's view of a stream: replayed elements first, then live ones."""

    name: str
    #: ids (first, last) asked for with `from_id` that are no longer retained, or None.
    lost: tuple[int, int] | None = None
    #: the id of the last element handed out by next_batch (the resume point).
    last_id: int = 0

    @property
    def stream_terminator(self) -> str | None:
        """The stream's agreed terminator as set by its producers now (it may be set after subscribing)."""
        return None

    @abc.abstractmethod
    async def next_batch(self, max_items: int | None = None, timeout: float | None = None) -> list[Element]:
        """Elements ready now (waiting up to `timeout` for one); [] on timeout.

        Raises SubscriptionEndedError (cut, stream deleted, closed) once nothing is left to read.
        """

    @abc.abstractmethod
    def ack(self, ele_id: int) -> None:
        """Record that everything up to `ele_id` was processed (ValueError if not yet received)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Leave the stream; idempotent."""

    async def __aenter__(self) -> AbstractSubscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AbstractBroker(abc.ABC):
    """Named streams: publish, subscribe (optionally from an id), stats, list, delete."""

    settings: BrokerSettings
    #: True when the other side of this broker qualifies names with the tenant (a worker's proxy:
    #: the frontend's StreamBridge does it); else the handler API qualifies them (tenancy.py).
    scoped_remotely: bool = False

    def check_elements(self, elements: Sequence[bytes]) -> None:
        """Refuse the whole batch if one element is empty or over `max_element_size`."""
        limit = self.settings.max_element_size
        if not elements or ({*map(type, elements)} == {bytes} and min(map(len, elements))
                            and max(map(len, elements)) <= limit):
            return  # (C-level passes: every kept SSE batch comes here; the loop below says which one)
        for i, data in enumerate(elements):
            if not isinstance(data, bytes):
                raise InvalidElementError(f"element {i} is {type(data).__name__}, not bytes")
            if len(data) > limit:
                raise ElementTooLargeError(f"element {i} is {len(data)} bytes; the limit is {limit} "
                                           f"(streams.maxElementSize); nothing was published")
            if not data:
                raise InvalidElementError(f"element {i} is empty; elements need at least one byte (an empty "
                                          f"SSE event is never dispatched); nothing was published")

    @abc.abstractmethod
    async def publish(self, name: str, elements: Sequence[bytes], *, timeout: float | None = None) -> list[int]:
        """Append elements in order and return their ids.

        Raises ElementTooLargeError (nothing published) or, on a 'block' stream whose slow
        subscriber does not make room within `timeout`, StreamBlockedError listing the ids
        that were published before it.
        """

    @abc.abstractmethod
    async def subscribe(self, name: str, *, from_id: int | None = None,
                        buffer: int | None = None) -> AbstractSubscription:
        """A new subscription; with `from_id`, replay retained elements with id > from_id first."""

    @abc.abstractmethod
    async def configure(self, name: str, options: StreamOptions) -> None:
        """Create the stream if needed and apply `options` (retention only widens)."""

    @abc.abstractmethod
    async def attach_producer(self, name: str, options: StreamOptions | None = None) -> None:
        """Count a producer on the stream (and configure it)."""

    @abc.abstractmethod
    async def detach_producer(self, name: str) -> None:
        """Uncount a producer."""

    @abc.abstractmethod
    async def stats(self, name: str) -> StreamStats:
        """Raises StreamNotFoundError for an unknown stream."""

    @abc.abstractmethod
    async def list(self) -> list[StreamStats]:
        """Stats of every stream, by name."""

    @abc.abstractmethod
    async def delete(self, name: str) -> None:
        """Remove the stream; its subscriptions end with StreamDeletedError. 404 when unknown."""

    async def close(self) -> None:  # noqa: B027 (optional hook: most brokers hold nothing)
        """Release the broker's resources; idempotent."""
