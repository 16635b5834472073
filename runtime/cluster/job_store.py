"""`jobs.store: redis` (cluster mode): job state and output items in Redis, readable by every node.

Keys share the job's hash tag, so they live on one Redis Cluster slot: `{prefix}:{job:ID}:state`
(the job's JSON fields) and `{prefix}:{job:ID}:out` (a list of JSON output items). A finished
job's keys expire after `jobs.retentionSeconds`. The node that accepted a job runs it and writes
it through; any other node reads it from here (`fetch`), so `/status`, `/stream` and `/events`
answer on every frontend. Cancels travel on the `{prefix}:jobs:cancel` channel to the node
running the job. A retry through any node takes the FAILED/TIMED_OUT job over in one script
(job_scripts.RETRY: checked, owner moved, output cleared, `taken:{node}:{id}` published to the
former owner, which forgets its copy); deletes are owner-checked, so the former owner's expiry
never deletes a job another node took. Writes go out in call order on one background task, each sent again while Redis
is unreachable (up to the node's lease).

A node that dies leaves its unfinished jobs behind: each node (listed in `{prefix}:jobs:nodes`)
keeps the ids of the jobs it owns in `{prefix}:{jobs-node:ID}:jobs` and renews
`{prefix}:{jobs-node:ID}:alive` (a lease of `jobs.takeoverSeconds`). Every job names its owner
in `{prefix}:{job:ID}:owner`, and its state and output are written only by a script that checks
that owner (a fence). When a lease lapses, a live node takes each job in one script that moves the
owner to itself (so exactly one node gets it, and a node that was only slow finds its later
writes refused), adopts it (the restart rules), and only then drops it from the dead node's set:
a claimer that fails half-way leaves the rest to the next one.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from ..jobs.errors import JobStoreError
from ..jobs.key_store import KeyBind, KeyClaimLostError, KeyStore
from ..jobs.model import Job
from ..jobs.store import SharedStore
from ..tasks import checkpoint, stop_tasks
from .idempotency_keys import RedisKeys
from .job_scripts import ADD, ADVANCE, CREATE, DELETE, RETRY, SAVE, TAKE, TAKEN
from .settings import through_outage

__all__ = ("RedisJobStore", "connect_store")

log = logging.getLogger("fnstream.jobs")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class RedisJobStore(SharedStore):
    """Job state in Redis; `load()` recovers nothing (a node does not own other nodes' jobs)."""

    durable = True

    def __init__(self, redis: Any, prefix: str, retention: float, lease: float = 15.0) -> None:
        self.redis = redis
        self.prefix = prefix
        self.retention = max(1, int(retention))
        self.node = uuid.uuid4().hex[:12]  # this process's owner id (a restarted node is a new owner)
        self.lease = lease
        self.cancel_channel = f"{prefix}:jobs:cancel"
        self._writes: asyncio.Queue[tuple[Callable[[], Awaitable[Any]], asyncio.Future[None]]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._leaser: asyncio.Task[None] | None = None
        self._leased = asyncio.Event()  # the writer waits for it: no other node sees this one's jobs unowned
        self._lost: set[str] = set()     # jobs another node took from this one (their writes were refused)

    def _state(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:state"

    def _out(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:out"

    def _cursor(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:cursor"

    def _fence(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:void"  # idempotency_keys.py: an id whose save is refused

    def _owner(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:owner"

    def _owned(self, node: str) -> str:
        return f"{self.prefix}:{{jobs-node:{node}}}:jobs"

    def _alive(self, node: str) -> str:
        return f"{self.prefix}:{{jobs-node:{node}}}:alive"

    @property
    def _nodes(self) -> str:
        return f"{self.prefix}:jobs:nodes"

    def _indexes(self, tenant: str, function: str) -> tuple[str, str, str]:
        """Sorted sets of job ids by creation time (every node's jobs: lists and health counts):
        all, the tenant's, the function's. Ids of expired jobs are dropped when read (`recent`)."""
        return (f"{self.prefix}:jobs:index", f"{self.prefix}:{{jobs-tenant:{tenant}}}:index",
                f"{self.prefix}:{{jobs-fn:{function}}}:index")

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._leaser = loop.create_task(self._keep_lease(), name="jobs-redis-lease")
        self._writer = loop.create_task(self._write_loop(), name="jobs-redis-writer")
        self._listener = loop.create_task(self._listen(), name="jobs-redis-cancels")

    async def close(self) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def nothing() -> None:
            return None

        await self._writes.put((nothing, done))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(done, 5)
        await stop_tasks((self._writer, self._listener, self._leaser), "jobs store")
        with contextlib.suppress(Exception):
            # A clean stop: the unfinished jobs left behind are the next node's at once (the restart rules).
            await self.redis.delete(self._alive(self.node))
        await self.redis.aclose()

    async def _write_loop(self) -> None:
        await self._leased.wait()
        while True:
            op, future = await self._writes.get()
            try:
                # A Redis restart of a few seconds is waited out (every op is idempotent: ADD skips
                # what is there), for as long as this node's lease: past it, its jobs are another's.
                await through_outage(op, time.monotonic() + self.lease, cap=1.0)
                if not future.done():
                    future.set_result(None)
                checkpoint()
            except KeyClaimLostError as exc:  # CREATE refused a fenced id: nothing stored (409, retry)
                if not future.done():
                    future.set_exception(exc)
                    future.add_done_callback(lambda f: f.cancelled() or f.exception())
            except Exception as exc:
                log.warning("jobs: a Redis write failed: %s", exc)
                if not future.done():  # the runner awaits it: retries, or fails the job (runtime/jobs/writes.py)
                    future.set_exception(JobStoreError(f"the Redis job store refused a write: {exc}"))
                    future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _queue(self, op: Callable[[], Awaitable[Any]]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writes.put_nowait((op, future))
        return future

    async def _listen(self) -> None:
        while True:
            try:
                pubsub = self.redis.pubsub()
                await pubsub.subscribe(self.cancel_channel)
                async for message in pubsub.listen():
                    checkpoint()
                    if message.get("type") != "message":
                        continue
                    data = message["data"]
                    text = data.decode() if isinstance(data, bytes) else str(data)
                    if text.startswith(TAKEN):  # `taken:{node}:{id}`: a retry through another node took it
                        node, _, job_id = text.removeprefix(TAKEN).partition(":")
                        if node == self.node and self.on_refused is not None:
                            self.on_refused(job_id)
                    elif self.on_cancel is not None:
                        self.on_cancel(text)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("jobs: cancel channel lost (%s); resubscribing", exc)
                await asyncio.sleep(0.5)

    # -- JobStore ----------------------------------------------------------------------------
    def save(self, job: Job, bind: KeyBind | None = None) -> asyncio.Future[None]:
        data = _dumps(job.row())
        job_id, owned = job.id, self._owned(self.node)
        ttl = self.retention if job.final else 0

        indexes, created = self._indexes(job.tenant, job.function), job.created_at
        keys = self.idempotency_keys() if bind is not None else None

        async def op() -> None:
            if bind is not None:  # its key's claim names this id: stored unless the id was fenced
                if await self.redis.eval(CREATE, 4, self._state(job_id), self._owner(job_id), self._out(job_id),
                                         self._fence(job_id), self.node, data, ttl) == -1:
                    raise KeyClaimLostError("this Idempotency-Key's claim ran out before its job was stored; "
                                            "retry")
            elif not await self.redis.eval(SAVE, 3, self._state(job_id), self._owner(job_id), self._out(job_id),
                                           self.node, data, ttl):
                self._refused(job_id)
                return
            async with self.redis.pipeline(transaction=False) as pipe:   # idempotent, one round trip
                if ttl:
                    pipe.srem(owned, job_id)
                else:
                    pipe.sadd(owned, job_id)
                for index in indexes:
                    pipe.zadd(index, {job_id: created})
                await pipe.execute()
            if bind is not None:
                assert isinstance(keys, RedisKeys)
                await keys.bound(bind)  # the claim already names the stored job: a crash here loses nothing

        return self._queue(op)

    def add_outputs(self, job_id: str, first_seq: int, items: list[Any], output_bytes: int = 0) -> asyncio.Future[None]:
        values = [_dumps(i) for i in items]

        async def op() -> None:
            if not await self.redis.eval(ADD, 2, self._owner(job_id), self._out(job_id), self.node, first_seq,
                                         *values):
                self._refused(job_id)

        return self._queue(op)

    def clear_outputs(self, job_id: str) -> asyncio.Future[None]:
        out, cursor = self._out(job_id), self._cursor(job_id)

        async def op() -> None:
            await self.redis.delete(out, cursor)

        return self._queue(op)

    def delete(self, job_ids: list[str]) -> asyncio.Future[None]:
        keys = [(self._state(i), self._out(i), self._cursor(i), self._owner(i)) for i in job_ids]
        owned = self._owned(self.node)

        async def op() -> None:
            for of_job in keys:  # one script per job: the keys of different jobs live on different slots
                await self.redis.eval(DELETE, 4, *of_job, self.node)  # not a job another node took (a retry)
            await self.redis.srem(owned, *job_ids)

        return self._queue(op)

    # -- reads by other nodes ----------------------------------------------------------------
    async def fetch(self, job_id: str, outputs_from: int = 0) -> Job | None:
        """The job as stored, with its output items from index `outputs_from` (0-based) on."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self._state(job_id))
            pipe.lrange(self._out(job_id), outputs_from, -1)
            data, items = await pipe.execute()
        if data is None:
            return None
        row = json.loads(data)
        job = Job.from_row(row, [json.loads(i) for i in items])
        return job

    def _make_keys(self, seconds: float) -> KeyStore:
        return RedisKeys(self.redis, self.prefix, seconds)  # shared: one job per key across the cluster

    async def retake(self, job: Job, again: Job) -> bool:
        """A retry of the FAILED/TIMED_OUT `job` (held here, or read from the store) as `again`: one
        script checks it still is as read (status and retried count), makes it this node's, clears its
        output and tells its former owner (job_scripts.RETRY). False when it was not as read."""
        data, job_id, owned = _dumps(again.row()), job.id, self._owned(self.node)
        taken: list[bool] = []

        async def op() -> None:
            await self.redis.sadd(owned, job_id)  # ours before it is: a refused one there is skipped by takers
            answer = await self.redis.eval(
                RETRY, 4, self._state(job_id), self._owner(job_id), self._out(job_id), self._cursor(job_id),
                self.node, job.retried, data, again.invocation_id, self.cancel_channel, job_id)
            taken[:] = [answer == 1]
            if answer != 1 and job.remote:
                await self.redis.srem(owned, job_id)
            if answer == 2 and self.on_refused is not None:  # another node's retry took it: forget it here
                self.on_refused(job_id)                     # (its message may still be on the way)

        await self._queue(op)
        return taken == [True]

    async def request_cancel(self, job_id: str) -> None:
        await self.redis.publish(self.cancel_channel, job_id)

    async def advance_cursor(self, job_id: str) -> list[Any]:
        ttl = self.retention + 86400  # outlives the job: its own keys expire after the retention
        items = await self.redis.eval(ADVANCE, 2, self._out(job_id), self._cursor(job_id), ttl)
        return [json.loads(i) for i in items]


    async def recent(self, *, function: str | None = None, tenant: str | None = None,
                     limit: int | None = None) -> list[Job]:
        everything, of_tenant, of_function = self._indexes(tenant or "", function or "")
        index = of_function if function is not None else of_tenant if tenant is not None else everything
        ids = [i.decode() if isinstance(i, bytes) else str(i)
               for i in await self.redis.zrevrange(index, 0, -1 if limit is None else limit - 1)]
        jobs: list[Job] = []
        gone: list[str] = []
        for at in range(0, len(ids), 500):   # a pipeline per 500: a long list does not hold one connection long
            chunk = ids[at:at + 500]
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in chunk:
                    pipe.get(self._state(job_id))
                    pipe.llen(self._out(job_id))
                replies = await pipe.execute()
            for n, job_id in enumerate(chunk):
                data, count = replies[2 * n], replies[2 * n + 1]
                if data is None:
                    gone.append(job_id)
                    continue
                job = Job.from_row(json.loads(data), [])
                job.cold_count, job.remote = int(count), True
                jobs.append(job)
        if gone:   # expired (retention): forgotten by the index too
            await self.redis.zrem(index, *gone)
        return jobs

    # -- a dead node's jobs ------------------------------------------------------------------
    def _refused(self, job_id: str) -> None:
        if self.on_refused is not None:
            self.on_refused(job_id)  # every time: a job taken, re-adopted and taken again stops again
        if job_id in self._lost:
            return
        if len(self._lost) >= 10_000:  # a bounded memory of which jobs went: enough to log each once
            self._lost.clear()
        self._lost.add(job_id)
        log.warning("jobs: job %s was taken over by another node while this one could not renew its lease "
                    "(a stall or a Redis outage longer than jobs.takeoverSeconds); this node stops running it "
                    "and its writes to it are refused", job_id)

    async def renew_lease(self) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self._alive(self.node), "1", px=max(100, int(self.lease * 1000)))
            pipe.sadd(self._nodes, self.node)
            await pipe.execute()
        self._leased.set()

    async def _keep_lease(self) -> None:
        while True:
            try:
                await self.renew_lease()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the lease may lapse, and another node take the jobs
                log.warning("jobs: could not renew this node's lease: %s", exc)
            checkpoint()
            await asyncio.sleep(self.lease / 3)

    async def claim_orphans(self, adopt: Callable[[Job], None]) -> int:
        """Take the unfinished jobs of nodes whose lease lapsed, one job at a time: `adopt` each
        (the runner's restart rules; its save makes the job this node's), then drop it from the dead
        node's set. How many were taken."""
        taken = 0
        for raw in await self.redis.smembers(self._nodes):
            node = raw.decode() if isinstance(raw, bytes) else str(raw)
            if node == self.node or await self.redis.exists(self._alive(node)):
                continue
            owned = self._owned(node)
            ids = [i.decode() if isinstance(i, bytes) else str(i) for i in await self.redis.smembers(owned)]
            for job_id in ids:
                data = await self.redis.eval(TAKE, 2, self._owner(job_id), self._state(job_id), node, self.node)
                if data is not None:
                    job = Job.from_row(json.loads(data), [json.loads(i) for i in
                                                          await self.redis.lrange(self._out(job_id), 0, -1)])
                    if not job.final:
                        await self.redis.sadd(self._owned(self.node), job_id)  # ours before it leaves theirs
                        adopt(job)
                        taken += 1
                await self.redis.srem(owned, job_id)
            if not await self.redis.scard(owned):
                await self.redis.srem(self._nodes, node)
            if ids:
                log.warning("jobs: node %s stopped renewing its lease; took over %d unfinished job(s)", node, taken)
        return taken


def connect_store(url: str, prefix: str, retention: float, lease: float) -> RedisJobStore:
    from .settings import connect

    client: aioredis.Redis = connect(url)  # type: ignore[assignment]
    return RedisJobStore(client, prefix, retention, lease)
