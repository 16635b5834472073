"""Where jobs (and admin-deployed functions) are kept: SQLite by default, or memory.

The runner keeps every live job in memory and writes each change through to the store, so reads
never wait for the disk; the store is what a restarted server comes back from. SQLite work runs
on one thread of its own, in submission order, never on the event loop. WAL with
`synchronous=NORMAL`: a committed write survives the process being killed (kill -9); only a
power loss may take the last commits. One server per file: a lock file says so at start.
A write the database refuses (disk full, read-only, I/O error) fails its future with
JobStoreError; a store that cannot be opened or read at start is a ConfigError naming the path.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import ConfigError
from ..fork_guard import forget, forget_files, release_files_in_forked_children, release_in_forked_children
from .cache import SMALL_RESULT
from .errors import JobStoreError
from .key_store import KeyBind, KeyClaimLostError, KeyStore, MemoryKeys, SqliteKeys, bind_in
from .model import Job

__all__ = ("JobStore", "MemoryJobStore", "SharedStore", "SqliteJobStore")

log = logging.getLogger("fnstream.jobs")

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outputs (job_id TEXT NOT NULL, seq INTEGER NOT NULL, item TEXT NOT NULL,
                                    PRIMARY KEY (job_id, seq));
CREATE TABLE IF NOT EXISTS functions (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS progress (job_id TEXT PRIMARY KEY, output_bytes INTEGER NOT NULL);
"""


# At start: unfinished jobs in full; finished ones as stubs, without their input and outputs, and
# with their result only when it is small (the cache's rule), so a restart does not read them all.
_UNFINISHED = "data ->> '$.status' IN ('IN_QUEUE', 'IN_PROGRESS')"
_UNFINISHED_OUTPUTS = f"""SELECT o.job_id, o.item FROM outputs o JOIN jobs ON jobs.id = o.job_id
WHERE {_UNFINISHED} ORDER BY o.job_id, o.seq"""
_ROWS = f"""SELECT CASE WHEN {_UNFINISHED} THEN data ELSE json_remove(data, '$.event', '$.result') END,
       {_UNFINISHED}, length(CAST(data -> '$.event' AS BLOB)),
       CASE WHEN length(CAST(data -> '$.result' AS BLOB)) <= {SMALL_RESULT} THEN data -> '$.result' END
FROM jobs"""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class JobStore:
    """The memory store (nothing survives a restart); the base of the durable ones."""

    durable = False
    readable = False  # read_job works: finished jobs need not stay in memory (runtime/jobs/cache.py)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def load(self) -> list[Job]:
        """Every stored job with its outputs (at start)."""
        return []

    async def read_job(self, job_id: str) -> Job | None:
        """The stored job with its outputs; None when not stored."""
        return None

    def save(self, job: Job, bind: KeyBind | None = None) -> asyncio.Future[None]:
        """Insert or replace the job's fields (not its outputs). Writes are queued at call time,
        so they reach the store in the order made; await the future for durability. With `bind`
        (a new job's first save, with an Idempotency-Key) the claimed key is bound to the job in the
        same transaction: both are stored or neither (KeyClaimLostError when the claim was lost)."""
        if bind is not None:
            keys = self.idempotency_keys()
            assert isinstance(keys, MemoryKeys)
            if not keys.bind_now(bind.tenant, bind.key, bind.fingerprint, job.id, bind.seconds):
                future = asyncio.get_running_loop().create_future()
                future.set_exception(KeyClaimLostError("this Idempotency-Key's claim ran out before its job was "
                                                       "stored; retry"))
                return future
        return _done()

    def add_outputs(self, job_id: str, first_seq: int, items: list[Any], output_bytes: int = 0) -> asyncio.Future[None]:
        """Append output items; `output_bytes` is the job's total after them (kept with the items,
        so a job recovered after kill -9 knows it without a rewrite of its row)."""
        return _done()

    def clear_outputs(self, job_id: str) -> asyncio.Future[None]:
        return _done()

    def delete(self, job_ids: list[str]) -> asyncio.Future[None]:
        return _done()

    async def load_functions(self) -> list[tuple[str, dict[str, Any]]]:
        """(key, spec) of each stored function; the key is `function_key(tenant, name)`, or the bare
        name a store written before names were per tenant used (frontend/jobs.py re-keys it)."""
        return []

    def save_function(self, key: str, spec: dict[str, Any]) -> asyncio.Future[None]:
        return _done()

    def delete_function(self, key: str) -> asyncio.Future[None]:
        return _done()

    _keys: KeyStore | None = None

    def idempotency_keys(self, seconds: float = 86400.0) -> KeyStore:
        """Where this store keeps `Idempotency-Key`s (runtime/jobs/key_store.py), bound for `seconds`
        (jobs.idempotencySeconds): one KeyStore per store, the one its `save` binds keys in."""
        if self._keys is None:
            self._keys = self._make_keys(seconds)
        return self._keys

    def _make_keys(self, seconds: float) -> KeyStore:
        return MemoryKeys()


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


class SharedStore(JobStore):
    """A store every node of a cluster reads (Redis): jobs of other nodes are found here."""

    on_cancel: Callable[[str], None] | None = None  # set by the runner: a cancel asked on another node
    on_refused: Callable[[str], None] | None = None  # set by the runner: another node took one of its jobs
    lease: float = 15.0  # seconds a node's jobs stay its own after it stops renewing its lease

    async def claim_orphans(self, adopt: Callable[[Job], None]) -> int:
        """Take the unfinished jobs of nodes whose lease lapsed: each passed to `adopt` (the runner
        re-runs or fails it) as it becomes this node's; how many."""
        raise NotImplementedError

    async def fetch(self, job_id: str, outputs_from: int = 0) -> Job | None:
        """The stored job with its output items from index `outputs_from` on; None when unknown."""
        raise NotImplementedError

    async def request_cancel(self, job_id: str) -> None:
        raise NotImplementedError

    async def retake(self, job: Job, again: Job) -> bool:
        """Retry `job` (FAILED or TIMED_OUT, of any node) as `again`, atomically: False when the stored
        job is no longer as `job` was read (retried meanwhile: when by another node, `on_refused` here);
        `again` is this node's from then on, and the node that held the job before forgets it
        (`on_refused` there). JobStoreError when the store refuses the write."""
        raise NotImplementedError

    async def advance_cursor(self, job_id: str) -> list[Any]:
        """RunPod's /stream cursor, shared by every node: the items not returned before."""
        raise NotImplementedError

    async def recent(self, *, function: str | None = None, tenant: str | None = None,
                     limit: int | None = None) -> list[Job]:
        """Jobs of every node (their state, the output items counted, not read), newest first:
        those of `function`, else of `tenant`, else all; `limit` at most."""
        raise NotImplementedError


class MemoryJobStore(JobStore):
    """`jobs.store: memory`: jobs live only as long as the process (the runner holds them)."""


class SqliteJobStore(JobStore):
    """`jobs.store: sqlite`: one file, one writer thread, WAL."""

    durable = True
    readable = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="fnstream-jobs-sqlite")
        self._db: sqlite3.Connection | None = None
        self._lock_file: IO[str] | None = None

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Queue `fn` on the store's thread now; the future resolves when it ran."""
        def call() -> T:
            assert self._db is not None, "the job store is not open"
            return fn(self._db)

        return asyncio.get_running_loop().run_in_executor(self._thread, call)

    def _make_keys(self, seconds: float) -> KeyStore:
        return SqliteKeys(self)  # in this file, on this thread: they survive a restart with the jobs

    def _write(self, fn: Callable[[sqlite3.Connection], object]) -> asyncio.Future[None]:
        def call(db: sqlite3.Connection) -> None:
            try:
                with db:
                    fn(db)
            except sqlite3.Error as exc:  # disk full, read-only, I/O error: the transaction rolled back
                raise JobStoreError(f"the job store {self.path} refused a write: {exc}") from None

        return self._run(call)

    def _take_lock(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{self.path}.lock", "w")  # noqa: SIM115 - held for the store's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise ConfigError(f"jobs.path {self.path} is in use by another fnstream server; give each "
                              "server its own jobs.path") from None
        lock.write(str(os.getpid()))
        lock.flush()
        release_in_forked_children(lock.fileno())  # a handler's fork must not keep the store locked
        release_files_in_forked_children(str(self.path))  # nor its database, WAL, journal of ends
        self._lock_file = lock

    async def open(self) -> None:
        def connect() -> None:
            try:
                self._take_lock()
                db = sqlite3.connect(self.path, check_same_thread=False)
                try:
                    db.execute("PRAGMA journal_mode=WAL")
                    db.execute("PRAGMA synchronous=NORMAL")
                    db.executescript(_SCHEMA)
                    db.execute("SELECT count(*) FROM jobs").fetchone()
                except BaseException:
                    db.close()
                    raise
                self._db = db
            except (sqlite3.Error, OSError) as exc:  # corrupt, not a database, read-only, no permission
                self._release_lock()
                raise ConfigError(f"jobs.path {self.path} cannot be used as the job store: {exc}") from None

        await asyncio.get_running_loop().run_in_executor(self._thread, connect)
        log.info("jobs stored in %s", self.path)

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            forget(self._lock_file.fileno())
            forget_files(str(self.path))
            self._lock_file.close()
            self._lock_file = None

    async def close(self) -> None:
        def disconnect() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._release_lock()

        await asyncio.get_running_loop().run_in_executor(self._thread, disconnect)
        await asyncio.to_thread(self._thread.shutdown)  # joining the (now idle) thread: off the loop too

    async def load(self) -> list[Job]:
        def read(db: sqlite3.Connection) -> list[Job]:
            outputs: dict[str, list[Any]] = {}
            for job_id, item in db.execute(_UNFINISHED_OUTPUTS):
                outputs.setdefault(job_id, []).append(json.loads(item))
            counts = dict(db.execute("SELECT job_id, count(*) FROM outputs GROUP BY job_id"))
            sizes = dict(db.execute("SELECT job_id, output_bytes FROM progress"))
            jobs = []
            for data, unfinished, input_bytes, small_result in db.execute(_ROWS):
                row = json.loads(data)
                row["output_bytes"] = max(row.get("output_bytes", 0), sizes.get(row["id"], 0))
                if unfinished:
                    jobs.append(Job.from_row(row, outputs.get(row["id"], [])))
                    continue
                row["event"] = None  # a stub (runtime/jobs/cache.py): read back in full when asked for
                row["result"] = None if small_result is None or row.get("aggregated") else json.loads(small_result)
                job = Job.from_row(row, [])
                job.cold_count, job.stored_input = counts.get(row["id"], 0), input_bytes or 0
                jobs.append(job)
            return sorted(jobs, key=lambda j: j.created_at)

        try:
            return await self._run(read)
        except (sqlite3.Error, ValueError, TypeError, KeyError) as exc:  # corrupt pages or rows
            raise ConfigError(f"jobs.path {self.path} cannot be read as the job store: {exc}") from None

    async def read_job(self, job_id: str) -> Job | None:
        def read(db: sqlite3.Connection) -> Job | None:
            found = db.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if found is None:
                return None
            items = [json.loads(i) for (i,) in db.execute("SELECT item FROM outputs WHERE job_id = ? ORDER BY seq",
                                                          (job_id,))]
            return Job.from_row(json.loads(found[0]), items)

        try:
            return await self._run(read)
        except sqlite3.Error as exc:
            raise JobStoreError(f"the job store {self.path} could not be read: {exc}") from None

    def save(self, job: Job, bind: KeyBind | None = None) -> asyncio.Future[None]:
        data = _dumps(job.row())

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO jobs (id, data) VALUES (?, ?)", (job.id, data))
            if bind is not None:  # the job and its key in one transaction: a kill -9 keeps both or neither
                bind_in(db, bind)

        return self._write(write)

    def add_outputs(self, job_id: str, first_seq: int, items: list[Any], output_bytes: int = 0) -> asyncio.Future[None]:
        rows = [(job_id, first_seq + i, _dumps(item)) for i, item in enumerate(items)]

        def append(db: sqlite3.Connection) -> None:
            db.executemany("INSERT OR REPLACE INTO outputs (job_id, seq, item) VALUES (?, ?, ?)", rows)
            db.execute("INSERT OR REPLACE INTO progress (job_id, output_bytes) VALUES (?, ?)", (job_id, output_bytes))

        return self._write(append)

    def clear_outputs(self, job_id: str) -> asyncio.Future[None]:
        def clear(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM outputs WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM progress WHERE job_id = ?", (job_id,))

        return self._write(clear)

    def delete(self, job_ids: list[str]) -> asyncio.Future[None]:
        ids = [(i,) for i in job_ids]

        def remove(db: sqlite3.Connection) -> None:
            db.executemany("DELETE FROM jobs WHERE id = ?", ids)
            db.executemany("DELETE FROM outputs WHERE job_id = ?", ids)
            db.executemany("DELETE FROM progress WHERE job_id = ?", ids)

        return self._write(remove)

    async def load_functions(self) -> list[tuple[str, dict[str, Any]]]:
        def read(db: sqlite3.Connection) -> list[tuple[str, dict[str, Any]]]:
            return [(key, json.loads(spec)) for (key, spec) in db.execute("SELECT name, spec FROM functions "
                                                                          "ORDER BY name")]

        return await self._run(read)

    def save_function(self, key: str, spec: dict[str, Any]) -> asyncio.Future[None]:
        data = _dumps(spec)
        return self._write(lambda db: db.execute("INSERT OR REPLACE INTO functions (name, spec) VALUES (?, ?)",
                                                 (key, data)))

    def delete_function(self, key: str) -> asyncio.Future[None]:
        return self._write(lambda db: db.execute("DELETE FROM functions WHERE name = ?", (key,)))
