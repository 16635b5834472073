"""fnstream's handler API: what a deployed function's code imports.

`Context` (passed in as the handler's second argument), the named-stream functions and their
configs, and the errors a handler may raise or catch. The runtime's internals (registry,
executors, dispatch, cluster...) live in their own modules and are not re-exported here.
"""
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
