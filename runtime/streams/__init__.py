"""Named streams: a broker (in-process by default), the handler API and name rules.

Handlers use `runtime.create_stream_producer(...)` etc. (or the same methods on `context`);
the frontend serves subscribe/publish over REST on the same broker.
"""
from __future__ import annotations

from .api import (
    Consumer,
    Producer,
    ProducerConfig,
    SubscriptionConfig,
    SubscriptionType,
    acreate_stream_consumer,
    acreate_stream_producer,
    adelete_stream,
    aquery_global_consumers_num,
    aquery_global_producers_num,
    bind_broker,
    create_stream_consumer,
    create_stream_producer,
    current_broker,
    delete_stream,
    query_global_consumers_num,
    query_global_producers_num,
    unbind_broker,
)
from .broker import AbstractBroker, AbstractSubscription, BrokerSettings, Element, StreamOptions, StreamStats
from .errors import (
    ElementTooLargeError,
    InvalidElementError,
    InvalidStreamIdError,
    InvalidStreamNameError,
    StreamBlockedError,
    StreamDeletedError,
    StreamError,
    StreamLimitError,
    StreamNotFoundError,
    SubscriptionCutError,
    SubscriptionEndedError,
)
from .memory import MemoryBroker, MemorySubscription
from .names import validate_stream_name
from .terminators import YUANRONG_END_MARKER, terminator_forms, terminator_set, terminator_text

__all__ = (
    # api
    "Consumer", "Producer", "ProducerConfig", "SubscriptionConfig", "SubscriptionType",
    "acreate_stream_consumer", "acreate_stream_producer", "adelete_stream",
    "aquery_global_consumers_num", "aquery_global_producers_num",
    "bind_broker", "unbind_broker", "current_broker",
    "create_stream_consumer", "create_stream_producer", "delete_stream",
    "query_global_consumers_num", "query_global_producers_num",
    # broker
    "AbstractBroker", "AbstractSubscription", "BrokerSettings", "Element", "StreamOptions", "StreamStats",
    # errors
    "ElementTooLargeError", "InvalidElementError", "InvalidStreamIdError", "InvalidStreamNameError",
    "StreamBlockedError", "StreamDeletedError", "StreamError", "StreamLimitError", "StreamNotFoundError",
    "SubscriptionCutError", "SubscriptionEndedError",
    # memory
    "MemoryBroker", "MemorySubscription",
    # names, terminators
    "validate_stream_name",
    "YUANRONG_END_MARKER", "terminator_forms", "terminator_set", "terminator_text",
)
