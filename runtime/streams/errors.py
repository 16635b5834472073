"""Named-stream errors: one branch of fnstream's exception tree, each with an HTTP status.

The REST layer turns them into `{"code", "message"}` before streaming starts and into an
`event: error` once it has; handler code sees ordinary exceptions it can catch by builtin type.
"""
from __future__ import annotations

from typing import Any

from ..errors import BadRequestError, FunctionServiceError

__all__ = (
    "StreamError",
    "InvalidStreamNameError",
    "InvalidStreamIdError",
    "ElementTooLargeError",
    "TooManyElementsError",
    "InvalidElementError",
    "StreamNotFoundError",
    "StreamLimitError",
    "StreamBlockedError",
    "SubscriptionEndedError",
    "SubscriptionCutError",
    "StreamDeletedError",
)


class StreamError(FunctionServiceError):
    """Root of the named-stream errors (openYuanrong's 'subcribe stream failed' code)."""

    code, status = 330500, 500


class InvalidStreamNameError(BadRequestError, StreamError):
    pass


class InvalidStreamIdError(BadRequestError, StreamError):
    """A resume id that is negative, not a number, or beyond the stream's last id."""


class InvalidElementError(BadRequestError, StreamError):
    """An element that cannot be carried faithfully (empty, or not bytes/text)."""


class ElementTooLargeError(StreamError, ValueError):
    code, status = 4140, 413


class TooManyElementsError(StreamError, ValueError):
    """One publish request of more elements than `streams.maxElementsPerPublish`."""

    code, status = 4140, 413


class StreamNotFoundError(StreamError, LookupError):
    code, status = 330404, 404


class StreamLimitError(StreamError):
    """Too many streams, or too many subscribers on one stream."""

    code, status = 330429, 429


class StreamBlockedError(StreamError, TimeoutError):
    """A 'block' stream waited too long for a slow subscriber; the element was not published."""

    code, status = 330503, 503

    def __init__(self, message: str, *, published: list[int] | None = None) -> None:
        super().__init__(message)
        self.published = list(published or [])

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "published": self.published}


class SubscriptionEndedError(StreamError, ConnectionError):
    """The subscription will deliver nothing more; `last_id` is the last id it delivered."""

    code, status = 330410, 410

    def __init__(self, message: str, *, last_id: int = 0) -> None:
        super().__init__(message)
        self.last_id = last_id

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "last_id": self.last_id}


class SubscriptionCutError(SubscriptionEndedError):
    """A 'cut' stream dropped this subscriber because its buffer was full: resume from `last_id`."""

    code = 330409

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "resume_from_id": self.last_id}


class StreamDeletedError(SubscriptionEndedError):
    code = 330404
