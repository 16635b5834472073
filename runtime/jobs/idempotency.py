"""`Idempotency-Key` on job submission: a client that retries a submit (its answer lost to a
timeout or a dropped connection) gets the job it already made, never a second run.

Per tenant, within `jobs.idempotencySeconds`: the same key with the same request (its
fingerprint: route, function and body) answers the first job's id; the same key with another
request is 422. One submit per key at a time: on this node a lock, across nodes the store's
claim (runtime/jobs/key_store.py); a request that finds the key claimed by a submit still being
stored waits for it up to `WAIT` seconds, then gets 409 (retry). The key is bound to the job by
the job's own save, in its transaction (`KeyBind`): a crash or a refused write never leaves a
stored job without its key, or a key naming a job that was never stored. A submit that fails
frees the key, so its retry may succeed.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import BadRequestError, FunctionServiceError
from .key_store import KeyBind, KeyStore
from .model import Job

__all__ = ("IdempotentSubmits", "IdempotencyConflictError", "IdempotencyMismatchError", "fingerprint",
           "parse_key")

log = logging.getLogger("fnstream.jobs")

MAX_KEY = 255
HOLD = 60.0   # seconds a claim outlives a node that died while storing its job
WAIT = 10.0   # seconds a request waits for another one storing the job of its key
POLL = 0.05   # seconds between looks at a key another node is storing


class IdempotencyMismatchError(FunctionServiceError):
    """The key was used for another request: a client bug, never answered with the other job."""

    code, status = 200422, 422


class IdempotencyConflictError(FunctionServiceError):
    """The key's first request is still being stored (on another node): retry."""

    code, status = 200409, 409


def parse_key(raw: str | None) -> str | None:
    """The header's key (the IETF draft sends a quoted sf-string; bare tokens are taken too); 400
    when empty, longer than 255 or not printable ASCII."""
    if raw is None:
        return None
    key = raw.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key or len(key) > MAX_KEY or not all(" " <= c <= "~" for c in key):
        raise BadRequestError(f"Idempotency-Key must be 1 to {MAX_KEY} printable ASCII characters")
    return key


def fingerprint(*parts: Any) -> str:
    """What makes two requests "the same": their parts as canonical JSON (key order and spacing
    of the body do not count), hashed."""
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class IdempotentSubmits:
    """Runs a submit once per (tenant, key); the others get its job id."""

    def __init__(self, keys: KeyStore, seconds: float) -> None:
        self.keys = keys
        self.seconds = seconds
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}  # lock, requests holding or waiting

    async def open(self) -> None:
        await self.keys.open()

    async def submit(self, tenant: str, key: str, print_: str,
                     create: Callable[[KeyBind], Awaitable[Job]]) -> tuple[str, Job | None]:
        """(job id, the job when this request created it; None when it is the first one's)."""
        slot = (tenant, key)
        lock, users = self._locks.get(slot) or (asyncio.Lock(), 0)
        self._locks[slot] = (lock, users + 1)
        try:
            async with lock:
                return await self._submit(tenant, key, print_, create)
        finally:
            lock, users = self._locks[slot]
            if users <= 1:
                del self._locks[slot]
            else:
                self._locks[slot] = (lock, users - 1)

    async def _submit(self, tenant: str, key: str, print_: str,
                      create: Callable[[KeyBind], Awaitable[Job]]) -> tuple[str, Job | None]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while (record := await self.keys.claim(tenant, key, print_, HOLD)) is not None:
            if record.fingerprint != print_:
                raise IdempotencyMismatchError("this Idempotency-Key was already used with another request "
                                               "(another function, route or body); use a new key for a new "
                                               "request")
            if record.job_id is not None:
                return record.job_id, None
            if loop.time() >= deadline:
                raise IdempotencyConflictError("a request with this Idempotency-Key is still being submitted; "
                                               "retry")
            await asyncio.sleep(POLL)
        bind = KeyBind(tenant, key, print_, self.seconds, self.keys.reserve(tenant, key, print_))
        try:
            job = await create(bind)  # stored with the key bound, in one transaction
        except BaseException:
            # Not stored: the key is free for the retry (a release after the job's save is refused
            # by the store: the key stays bound). Shielded: a cancelled request still frees it.
            release = asyncio.ensure_future(self.keys.release(tenant, key, print_))
            release.add_done_callback(_logged)
            with contextlib.suppress(Exception):  # logged; the submit's own error is the answer
                await asyncio.shield(release)
            raise
        return job.id, job


def _logged(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.error("jobs: an Idempotency-Key write failed: %s", exc)
