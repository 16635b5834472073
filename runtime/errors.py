"""One exception tree for fnstream, carrying openYuanrong's inner codes and an HTTP status.

The frontend turns any `FunctionServiceError` into `{"code", "message"}` with `X-Inner-Code`;
nothing else needs to know how an error maps to HTTP.
"""
from __future__ import annotations

from typing import Any

__all__ = (
    "FunctionServiceError",
    "BadRequestError",
    "UnauthorizedError",
    "ForbiddenError",
    "MisdirectedRequestError",
    "FunctionNotFoundError",
    "NotAcceptableError",
    "BodyTooLargeError",
    "ConcurrencyLimitError",
    "ServiceUnavailableError",
    "HandlerError",
    "InitializerError",
    "ResultNotSerializableError",
    "ResponseTooLargeError",
    "FunctionTimeoutError",
    "ManifestError",
    "DeployError",
    "ConfigError",
    "StreamClosedError",
    "StreamWriteError",
    "StreamBufferFullError",
    "handler_failure",
    "handler_failure_message",
)


class FunctionServiceError(Exception):
    """Root of fnstream's errors: an inner `code`, an HTTP `status` and a clear message."""

    code: int = 200500
    status: int = 500

    def __init__(self, message: str, *, code: int | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


class BadRequestError(FunctionServiceError, ValueError):
    code, status = 200400, 400


class UnauthorizedError(FunctionServiceError):
    code, status = 200401, 401


class ForbiddenError(FunctionServiceError):
    code, status = 200403, 403


class MisdirectedRequestError(FunctionServiceError):
    """The request's Host is not one this server answers for (frontend.allowedHosts)."""

    code, status = 200421, 421


class FunctionNotFoundError(FunctionServiceError, LookupError):
    code, status = 150424, 404


class NotAcceptableError(FunctionServiceError):
    code, status = 200406, 406


class BodyTooLargeError(FunctionServiceError):
    code, status = 4140, 413


class ConcurrencyLimitError(FunctionServiceError):
    code, status = 200429, 429


class ServiceUnavailableError(FunctionServiceError):
    """The server is shutting down, or a service it needs (e.g. the cluster's Redis) is unreachable."""

    code, status = 200503, 503


class HandlerError(FunctionServiceError):
    """The user's handler raised (or called sys.exit)."""

    code, status = 4001, 500


class InitializerError(FunctionServiceError):
    """The function's initializer raised; every invocation fails until a redeploy."""

    code, status = 4201, 500


class ResultNotSerializableError(FunctionServiceError):
    code, status = 4007, 500


class ResponseTooLargeError(FunctionServiceError):
    code, status = 4004, 500


class FunctionTimeoutError(FunctionServiceError, TimeoutError):
    code, status = 4010, 504


class ManifestError(FunctionServiceError, ValueError):
    """A manifest is invalid; the message names the file and the field."""

    code, status = 200400, 400


class DeployError(FunctionServiceError):
    """Code could not be loaded (import failed, codePath outside the code roots...)."""

    code, status = 200400, 400


class ConfigError(FunctionServiceError, ValueError):
    code, status = 200400, 400


class StreamClosedError(FunctionServiceError, ConnectionError):
    """The invocation's output is closed: the client went away or the function timed out."""

    code, status = 4001, 500


class StreamWriteError(FunctionServiceError, ValueError):
    """A single stream write was refused (too large, not UTF-8...)."""

    code, status = 4001, 500


class StreamBufferFullError(StreamWriteError):
    """An async handler wrote to a full buffer without awaiting the previous write."""


def handler_failure_message(detail: str) -> str:
    """openYuanrong's wording for a handler that failed; `detail` says how."""
    return f"Fail to run user call handler. err: {detail}"


def handler_failure(exc: BaseException) -> HandlerError:
    """The HandlerError for whatever the user's code raised (or its sys.exit)."""
    if isinstance(exc, SystemExit):
        return HandlerError(handler_failure_message(f"the handler called sys.exit({exc.code!r})"))
    return HandlerError(handler_failure_message(f"{type(exc).__name__}: {exc}"))
