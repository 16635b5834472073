"""Errors of the job API (fnstream's inner codes; RunPod routes show the message as `error`)."""
from __future__ import annotations

from ..errors import FunctionServiceError

__all__ = (
    "JobBadRequestError",
    "JobItemError",
    "JobNotFoundError",
    "JobOutputTooLargeError",
    "JobQueueFullError",
    "JobStateError",
)


class JobNotFoundError(FunctionServiceError, LookupError):
    """No such job, or one of another tenant (the same answer: its existence is not revealed)."""

    code, status = 200404, 404


class JobBadRequestError(FunctionServiceError, ValueError):
    code, status = 200400, 400


class JobStateError(FunctionServiceError):
    """The job is not in a state that allows the request (cancel of a finished job, retry of a running one)."""

    code, status = 200409, 409


class JobQueueFullError(FunctionServiceError):
    code, status = 200429, 429


class JobOutputTooLargeError(FunctionServiceError):
    code, status = 200413, 413


class JobItemError(FunctionServiceError):
    """A RunPod-style handler returned or yielded a dict with an `error` key."""

    code, status = 4001, 500
