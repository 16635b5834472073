"""fnstream's handler API: what a deployed function's code imports.

`Context` (passed in as the handler's second argument), the named-stream functions and their
configs, and the errors a handler may raise or catch. The runtime's internals (registry,
executors, dispatch, cluster...) live in their own modules and are not re-exported here.

Each name is imported on first use (PEP 562): importing one internal module (`runtime.errors`,
`runtime.logs`) must not load the whole stream API with asyncio, which the CLI's quick commands
never need.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Context
    from .errors import (
        FunctionServiceError,
        HandlerError,
        StreamBufferFullError,
        StreamClosedError,
        StreamWriteError,
    )
    from .streams import (
        Consumer,
        Element,
        Producer,
        ProducerConfig,
        SubscriptionConfig,
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
    from .streams.errors import StreamError

_WHERE = {
    "Context": ".context",
    **dict.fromkeys(("FunctionServiceError", "HandlerError", "StreamBufferFullError", "StreamClosedError",
                     "StreamWriteError"), ".errors"),
    "StreamError": ".streams.errors",
    **dict.fromkeys(("Consumer", "Element", "Producer", "ProducerConfig", "SubscriptionConfig",
                     "create_stream_consumer", "create_stream_producer", "delete_stream",
                     "query_global_consumers_num", "query_global_producers_num",
                     "acreate_stream_consumer", "acreate_stream_producer", "adelete_stream",
                     "aquery_global_consumers_num", "aquery_global_producers_num"), ".streams"),
}

__all__ = (
    "Context",
    "FunctionServiceError", "HandlerError", "StreamBufferFullError", "StreamClosedError", "StreamWriteError",
    "StreamError",
    "Consumer", "Element", "Producer", "ProducerConfig", "SubscriptionConfig",
    "create_stream_consumer", "create_stream_producer", "delete_stream",
    "query_global_consumers_num", "query_global_producers_num",
    "acreate_stream_consumer", "acreate_stream_producer", "adelete_stream",
    "aquery_global_consumers_num", "aquery_global_producers_num",
)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]
