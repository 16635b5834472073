"""Where `Idempotency-Key`s live: key → (fingerprint of the first request, its job id).

A key is claimed (pending, for `hold` seconds) before its job is stored, then bound to the job
for `jobs.idempotencySeconds` by the job's own save, in one transaction (`KeyBind`: the job
store's save binds it, so no crash leaves a job without its key or a key naming no job); a
submit that failed releases its claim. Expired keys are purged.
Keys are stored hashed (sha256 of tenant and key): a row is small whatever the client sent.
The memory store's keys die with the process; SQLite's live in the job store's file (on its
thread, in its order), so they survive a restart; the Redis ones (runtime/cluster) are shared by
every node.
"""
from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from ..errors import FunctionServiceError
from .errors import JobStoreError

__all__ = ("KeyBind", "KeyClaimLostError", "KeyRecord", "KeyStore", "MemoryKeys", "SqliteKeys", "bind_in",
           "key_digest")

T = TypeVar("T")

PURGE_EVERY = 60.0  # seconds between purges of expired keys (at most)


class _SqliteThread(Protocol):
    """The SQLite job store as its keys use it (runtime/jobs/store.py): its file and its thread."""

    path: Path

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]: ...


def key_digest(tenant: str, key: str) -> str:
    return hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key already claimed: the fingerprint of its first request and its job (None: that
    request is still being stored)."""

    fingerprint: str
    job_id: str | None


@dataclass(frozen=True, slots=True)
class KeyBind:
    """A claimed key, bound to its job by the job's first save (JobStore.save), in its transaction."""

    tenant: str
    key: str
    fingerprint: str
    seconds: float  # jobs.idempotencySeconds
    job_id: str     # the id the job is made with (KeyStore.reserve)


class KeyClaimLostError(FunctionServiceError):
    """The key's claim was lost before its job was stored (the hold ran out and another request
    took the key over): the job is not stored; retry (the key names the other request's job)."""

    code, status = 200409, 409


class KeyStore:
    """The interface; each method is atomic against the others for one key."""

    def reserve(self, tenant: str, key: str, fingerprint: str) -> str:
        """The job id a submit that just claimed the key makes its job with."""
        return str(uuid.uuid4())

    async def open(self) -> None:
        """Forget claims left pending by a process that died (where the store outlives it)."""

    async def claim(self, tenant: str, key: str, fingerprint: str, hold: float) -> KeyRecord | None:
        """Claim the key for `hold` seconds (None), or the record of whoever has it."""
        raise NotImplementedError

    async def bind(self, tenant: str, key: str, fingerprint: str, job_id: str, seconds: float) -> bool:
        """The claimed key now names `job_id` for `seconds`; False if the claim was lost meanwhile."""
        raise NotImplementedError

    async def release(self, tenant: str, key: str, fingerprint: str) -> None:
        """Drop a claim whose request failed (its job was not stored): the key is free again."""
        raise NotImplementedError


class MemoryKeys(KeyStore):
    """`jobs.store: memory`: keys in a dict, as long as the process lives."""

    def __init__(self) -> None:
        self._keys: dict[str, tuple[str, str | None, float]] = {}  # digest -> (fingerprint, job id, expires)
        self._purged = time.monotonic()

    def _purge(self, now: float) -> None:
        if now - self._purged >= PURGE_EVERY:
            self._purged = now
            self._keys = {k: v for k, v in self._keys.items() if v[2] > now}

    async def claim(self, tenant: str, key: str, fingerprint: str, hold: float) -> KeyRecord | None:
        now = time.monotonic()
        self._purge(now)
        digest = key_digest(tenant, key)
        found = self._keys.get(digest)
        if found is not None and found[2] > now:
            return KeyRecord(found[0], found[1])
        self._keys[digest] = (fingerprint, None, now + hold)
        return None

    async def bind(self, tenant: str, key: str, fingerprint: str, job_id: str, seconds: float) -> bool:
        return self.bind_now(tenant, key, fingerprint, job_id, seconds)

    def bind_now(self, tenant: str, key: str, fingerprint: str, job_id: str, seconds: float) -> bool:
        """`bind`, at once (the memory store's save binds with it: no await between)."""
        digest = key_digest(tenant, key)
        found = self._keys.get(digest)
        if found is None or found[0] != fingerprint or found[1] is not None:
            return False
        self._keys[digest] = (fingerprint, job_id, time.monotonic() + seconds)
        return True

    async def release(self, tenant: str, key: str, fingerprint: str) -> None:
        digest = key_digest(tenant, key)
        found = self._keys.get(digest)
        if found is not None and found[0] == fingerprint and found[1] is None:
            del self._keys[digest]


_SCHEMA = """CREATE TABLE IF NOT EXISTS idempotency (digest TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,
                                                     job_id TEXT, expires REAL NOT NULL)"""


class SqliteKeys(KeyStore):
    """Keys in the SQLite job store's file, on its thread: one server per file (its lock), so a
    claim and its check are one step of that thread. Expiry is wall-clock (it outlives restarts)."""

    def __init__(self, store: _SqliteThread) -> None:
        self.store = store
        self._purged = 0.0

    async def _step(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call(db: sqlite3.Connection) -> T:
            try:
                with db:
                    return fn(db)
            except sqlite3.Error as exc:
                raise JobStoreError(f"the job store {self.store.path} refused an Idempotency-Key write: "
                                    f"{exc}") from None

        return await self.store._run(call)

    async def open(self) -> None:
        now = time.time()

        def prepare(db: sqlite3.Connection) -> None:
            db.execute(_SCHEMA)
            # Pending claims were this server's before it stopped: their requests were never answered.
            db.execute("DELETE FROM idempotency WHERE job_id IS NULL OR expires <= ?", (now,))

        await self._step(prepare)

    async def claim(self, tenant: str, key: str, fingerprint: str, hold: float) -> KeyRecord | None:
        digest, now = key_digest(tenant, key), time.time()
        purge = now - self._purged >= PURGE_EVERY
        if purge:
            self._purged = now

        def claim(db: sqlite3.Connection) -> KeyRecord | None:
            if purge:
                db.execute("DELETE FROM idempotency WHERE expires <= ?", (now,))
            row = db.execute("SELECT fingerprint, job_id FROM idempotency WHERE digest = ? AND expires > ?",
                             (digest, now)).fetchone()
            if row is not None:
                return KeyRecord(row[0], row[1])
            db.execute("INSERT OR REPLACE INTO idempotency (digest, fingerprint, job_id, expires) "
                       "VALUES (?, ?, NULL, ?)", (digest, fingerprint, now + hold))
            return None

        return await self._step(claim)

    async def bind(self, tenant: str, key: str, fingerprint: str, job_id: str, seconds: float) -> bool:
        return await self._step(lambda db: _bind(db, tenant, key, fingerprint, job_id, seconds))

    async def release(self, tenant: str, key: str, fingerprint: str) -> None:
        digest = key_digest(tenant, key)

        def release(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM idempotency WHERE digest = ? AND fingerprint = ? AND job_id IS NULL",
                       (digest, fingerprint))

        await self._step(release)


def _bind(db: sqlite3.Connection, tenant: str, key: str, fingerprint: str, job_id: str, seconds: float) -> bool:
    cursor = db.execute("UPDATE idempotency SET job_id = ?, expires = ? WHERE digest = ? AND fingerprint = ? AND "
                        "job_id IS NULL", (job_id, time.time() + seconds, key_digest(tenant, key), fingerprint))
    return cursor.rowcount == 1


def bind_in(db: sqlite3.Connection, bind: KeyBind) -> None:
    """Bind the claimed key in the job's save, its transaction (the SQLite store's `save`): raises,
    so the job is not stored either, when the claim is not there any more."""
    if not _bind(db, bind.tenant, bind.key, bind.fingerprint, bind.job_id, bind.seconds):
        raise KeyClaimLostError("this Idempotency-Key's claim ran out before its job was stored; retry")
