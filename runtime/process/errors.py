"""Errors only the process executor raises: a worker that died or ran out of memory.

Both are handler failures (inner code 4001) with a message that says what happened to the
worker; the frontend and the other invocations are not affected.
"""
from __future__ import annotations

from .. import errors as _core
from ..errors import FunctionServiceError, HandlerError

__all__ = ("JavaHandlerError", "MemoryLimitError", "WorkerCrashedError", "WorkerUnavailableError", "error_from_wire")


class JavaHandlerError(HandlerError):
    """A Java handler threw: openYuanrong's Java runtime answers 4002 (FaaSHandler FUNCTION_RUN_ERROR,
    the exception's toString() as message) where its Python one answers 4001."""

    code = 4002


class WorkerCrashedError(HandlerError):
    """The worker process exited or was killed by a signal during the invocation."""


class MemoryLimitError(HandlerError, MemoryError):
    """The handler went over the manifest's `memory` (the worker's RLIMIT_AS)."""


class WorkerUnavailableError(HandlerError):
    """The function's workers cannot start (e.g. they die before they are ready)."""


def error_from_wire(name: str, message: str) -> FunctionServiceError:
    """Rebuild the error a worker reported by class name; unknown names become HandlerError."""
    cls = globals().get(name) if name in __all__ else getattr(_core, name, None)
    if not (isinstance(cls, type) and issubclass(cls, FunctionServiceError)):
        cls = HandlerError
    return cls(message)
