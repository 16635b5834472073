"""Errors of the job API (fnstream's inner codes; RunPod routes show the message as `error`).

Each is a kind of the matching general error (runtime/errors.py), so it carries that code and
status; only the ones with no general twin set their own.
"""
from __future__ import annotations

from ..errors import BadRequestError, ConcurrencyLimitError, FunctionServiceError, HandlerError

__all__ = (
    "JobBadRequestError",
    "JobInputTooLargeError",
    "JobItemError",
    "JobNotFoundError",
    "JobOutputTooLargeError",
    "JobQueueFullError",
    "JobQuotaError",
    "JobStateError",
    "JobStoreError",
)


class JobNotFoundError(FunctionServiceError, LookupError):
    """No such job, or one of another tenant (the same answer: its existence is not revealed)."""

    code, status = 200404, 404


class JobBadRequestError(BadRequestError):
    """A job request that cannot be taken (bad policy, webhook, input)."""


class JobStateError(FunctionServiceError):
    """The job is not in a state that allows the request (cancel of a finished job, retry of a running one)."""

    code, status = 200409, 409


class JobQueueFullError(ConcurrencyLimitError):
    """jobs.maxQueued jobs are waiting already."""


class JobOutputTooLargeError(FunctionServiceError):
    code, status = 200413, 413


class JobItemError(HandlerError):
    """A RunPod-style handler returned or yielded a dict with an `error` key."""


class JobInputTooLargeError(FunctionServiceError):
    """The job's input passed jobs.maxInputBytes (jobs.maxInputBytesSync for /runsync)."""

    code, status = 200413, 413


class JobQuotaError(FunctionServiceError):
    """The tenant's stored jobs hold jobs.tenantQuotaBytes already."""

    code, status = 200507, 507


class JobStoreError(FunctionServiceError):
    """The job store refused a write (disk full, read-only, I/O error): nothing was accepted or
    recorded on the strength of it. 507 Insufficient Storage, as RunPod and WebDAV use it."""

    code, status = 200507, 507
