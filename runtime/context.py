"""The `context` a handler receives: openYuanrong's method names plus snake_case equivalents."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from . import streams

if TYPE_CHECKING:
    from .manifest import FunctionSpec
    from .surface import HandlerInvocation, HandlerStream

__all__ = ("Context",)


class Context:
    """What a handler (or initializer, with no invocation) can know and use."""

    def __init__(self, spec: FunctionSpec, invocation: HandlerInvocation | None = None) -> None:
        self._spec = spec
        self._invocation = invocation
        self._started = invocation.started if invocation else time.monotonic()
        self._logger: logging.Logger | None = None  # made on first use: most handlers never log

    # -- openYuanrong names ------------------------------------------------------------------
    def getRequestID(self) -> str:
        """The trace id, as openYuanrong returns it (X-Trace-Id)."""
        return self._invocation.trace_id if self._invocation else ""

    def getFunctionName(self) -> str:
        return self._spec.name

    def getVersion(self) -> str:
        return self._spec.version

    def getTenantID(self) -> str:
        return self._spec.tenant

    def getNamespace(self) -> str:
        return self._spec.namespace

    def getMemorySize(self) -> int:
        return self._spec.memory

    def getTimeout(self) -> float:
        return self._spec.timeout

    def getUserData(self, key: str, default: Any = None) -> Any:
        return self._spec.environment.get(key, default)

    def getRemainingTimeInMilliSeconds(self) -> int:
        if self._invocation is None:
            return int(self._spec.timeout * 1000)
        return int(self._invocation.remaining() * 1000)

    def getRunningTimeInSeconds(self) -> float:
        return time.monotonic() - self._started

    def getLogger(self) -> logging.Logger:
        if self._logger is None:
            self._logger = logging.getLogger(f"fnstream.function.{self._spec.name}")
        return self._logger

    def get_stream(self) -> HandlerStream:
        if self._invocation is None:
            raise RuntimeError("get_stream() is only available inside an invocation, not in the initializer")
        return self._invocation.stream

    def get_trace_id(self) -> str:
        return self.getRequestID()

    def get_invoke_id(self) -> str:
        return self._invocation.id if self._invocation else ""

    # -- named streams (runtime/streams): sync forms for thread handlers, `a...` forms to await --
    create_stream_producer = staticmethod(streams.create_stream_producer)
    create_stream_consumer = staticmethod(streams.create_stream_consumer)
    delete_stream = staticmethod(streams.delete_stream)
    query_global_producers_num = staticmethod(streams.query_global_producers_num)
    query_global_consumers_num = staticmethod(streams.query_global_consumers_num)
    acreate_stream_producer = staticmethod(streams.acreate_stream_producer)
    acreate_stream_consumer = staticmethod(streams.acreate_stream_consumer)
    adelete_stream = staticmethod(streams.adelete_stream)
    aquery_global_producers_num = staticmethod(streams.aquery_global_producers_num)
    aquery_global_consumers_num = staticmethod(streams.aquery_global_consumers_num)

    # -- snake_case equivalents --------------------------------------------------------------
    get_request_id = getRequestID
    get_function_name = getFunctionName
    get_version = getVersion
    get_tenant_id = getTenantID
    get_namespace = getNamespace
    get_memory_size = getMemorySize
    get_timeout = getTimeout
    get_user_data = getUserData
    get_remaining_time_in_milliseconds = getRemainingTimeInMilliSeconds
    get_running_time_in_seconds = getRunningTimeInSeconds
    get_logger = getLogger

    @property
    def environment(self) -> dict[str, str]:
        return dict(self._spec.environment)

    @property
    def logger(self) -> logging.Logger:
        return self.getLogger()
