"""openYuanrong's `yr` data-stream API, served by fnstream's named streams (runtime/streams).

Only what a function-service handler uses: `create_stream_producer`, `create_stream_consumer`,
`delete_stream`, `query_global_producers_num`, `query_global_consumers_num`, `ProducerConfig`,
`SubscriptionConfig`, `SubscriptionType`, `Element` (and the `a...` async forms fnstream adds). Inside fnstream the
runtime is already up, so `init()` / `finalize()` have nothing to do and `is_initialized()` is true.
"""
from __future__ import annotations

from typing import Any

from runtime.streams import (
    Consumer,
    Element,
    Producer,
    ProducerConfig,
    SubscriptionConfig,
    SubscriptionType,
    acreate_stream_consumer,
    acreate_stream_producer,
    adelete_stream,
    aquery_global_consumers_num,
    aquery_global_producers_num,
    create_stream_consumer,
    create_stream_producer,
    delete_stream,
    query_global_consumers_num,
    query_global_producers_num,
)

__all__ = (
    "FNSTREAM_SHIM",
    "Consumer",
    "Element",
    "Producer",
    "ProducerConfig",
    "SubscriptionConfig",
    "SubscriptionType",
    "acreate_stream_consumer",
    "acreate_stream_producer",
    "adelete_stream",
    "aquery_global_consumers_num",
    "aquery_global_producers_num",
    "create_stream_consumer",
    "create_stream_producer",
    "delete_stream",
    "finalize",
    "init",
    "is_initialized",
    "query_global_consumers_num",
    "query_global_producers_num",
)

FNSTREAM_SHIM = True  # tells this module from a real openYuanrong `yr`


def init(*args: Any, **kwargs: Any) -> None:
    """Accepted for openYuanrong code: fnstream's runtime is already initialised."""


def finalize(*args: Any, **kwargs: Any) -> None:
    """Accepted for openYuanrong code: fnstream stops its runtime itself."""


def is_initialized() -> bool:
    return True
