"""fnstream's function runtime: manifests, registry, handler loading, Context, executors, errors.

Handler authors need only `Context` (passed in) and, for named streams, the stream functions.
"""
from .config import Config, load_config
from .context import Context
from .errors import (
    FunctionServiceError,
    HandlerError,
    StreamClosedError,
    StreamWriteError,
)
from .executor import Executor
from .invocation import Invocation, StreamWriter
from .manifest import FunctionSpec, load_deploy_dir, load_manifest_file, parse_manifest
from .registry import Deployment, Registry
from .streams import (
    Consumer,
    Element,
    Producer,
    ProducerConfig,
    SubscriptionConfig,
    create_stream_consumer,
    create_stream_producer,
    delete_stream,
    query_global_consumers_num,
    query_global_producers_num,
)

__all__ = (
    "Config", "load_config",
    "Context",
    "FunctionServiceError", "HandlerError", "StreamClosedError", "StreamWriteError",
    "Executor",
    "Invocation", "StreamWriter",
    "FunctionSpec", "load_deploy_dir", "load_manifest_file", "parse_manifest",
    "Deployment", "Registry",
    "Consumer", "Element", "Producer", "ProducerConfig", "SubscriptionConfig",
    "create_stream_consumer", "create_stream_producer", "delete_stream",
    "query_global_consumers_num", "query_global_producers_num",
)
