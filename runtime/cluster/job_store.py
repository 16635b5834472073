"""`jobs.store: redis` (cluster mode): job state and output items in Redis, readable by every node.

Keys share the job's hash tag, so they live on one Redis Cluster slot: `{prefix}:{job:ID}:state`
(the job's JSON fields) and `{prefix}:{job:ID}:out` (a list of JSON output items). A finished
job's keys expire after `jobs.retentionSeconds`. The node that accepted a job runs it and writes
it through; any other node reads it from here (`fetch`), so `/status`, `/stream` and `/events`
answer on every frontend. Cancels travel on the `{prefix}:jobs:cancel` channel to the node
running the job. Writes go out in call order on one background task.

A node that dies leaves its unfinished jobs behind: each node keeps the ids of the jobs it owns
in `{prefix}:{jobs-node:ID}:jobs` and renews `{prefix}:{jobs-node:ID}:alive` (a lease of
`jobs.takeoverSeconds`). When a lease lapses, the first node to notice claims the whole set in
one script (`claim_orphans`; both keys share a hash tag) and applies the restart rules to them.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from ..jobs.model import Job
from ..jobs.store import SharedStore

__all__ = ("RedisJobStore", "connect_store")

log = logging.getLogger("fnstream.jobs")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# RunPod's /stream cursor, advanced atomically: the items past it, and the cursor moved past them.
_ADVANCE = """
local n = redis.call('LLEN', KEYS[1])
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > c then
  redis.call('SET', KEYS[2], n, 'EX', ARGV[1])
  return redis.call('LRANGE', KEYS[1], c, n - 1)
end
return {}
"""

# Take a dead node's unfinished jobs: nothing while its lease lives, else its job ids, removed at once
# (so one node takes them, whichever asks first).
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {} end
local ids = redis.call('SMEMBERS', KEYS[2])
redis.call('DEL', KEYS[2])
return ids
"""


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

    def _state(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:state"

    def _out(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:out"

    def _cursor(self, job_id: str) -> str:
        return f"{self.prefix}:{{job:{job_id}}}:cursor"

    def _owned(self, node: str) -> str:
        return f"{self.prefix}:{{jobs-node:{node}}}:jobs"

    def _alive(self, node: str) -> str:
        return f"{self.prefix}:{{jobs-node:{node}}}:alive"

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await self.renew_lease()  # before the first save, so no other node ever sees this one's jobs unowned
        self._writer = loop.create_task(self._write_loop(), name="jobs-redis-writer")
        self._listener = loop.create_task(self._listen(), name="jobs-redis-cancels")
        self._leaser = loop.create_task(self._keep_lease(), name="jobs-redis-lease")

    async def close(self) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def nothing() -> None:
            return None

        await self._writes.put((nothing, done))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(done, 5)
        tasks = [t for t in (self._writer, self._listener, self._leaser) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            # A clean stop: the unfinished jobs left behind are the next node's at once (the restart rules).
            await self.redis.delete(self._alive(self.node))
        await self.redis.aclose()

    async def _write_loop(self) -> None:
        while True:
            op, future = await self._writes.get()
            try:
                await op()
                if not future.done():
                    future.set_result(None)
            except Exception as exc:
                log.warning("jobs: a Redis write failed: %s", exc)
                if not future.done():
                    future.set_exception(exc)
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
                    if message.get("type") == "message" and self.on_cancel is not None:
                        data = message["data"]
                        self.on_cancel(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("jobs: cancel channel lost (%s); resubscribing", exc)
                await asyncio.sleep(0.5)

    # -- JobStore ----------------------------------------------------------------------------
    def save(self, job: Job) -> asyncio.Future[None]:
        data = _dumps(job.row())
        state, out, owned = self._state(job.id), self._out(job.id), self._owned(self.node)
        ttl = self.retention if job.final else None

        async def op() -> None:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(state, data, ex=ttl)
                if ttl is not None:
                    pipe.expire(out, ttl)
                    pipe.srem(owned, job.id)
                else:
                    pipe.sadd(owned, job.id)
                await pipe.execute()

        return self._queue(op)

    def add_outputs(self, job_id: str, first_seq: int, items: list[Any]) -> asyncio.Future[None]:
        values = [_dumps(i) for i in items]
        out = self._out(job_id)

        async def op() -> None:
            await self.redis.rpush(out, *values)

        return self._queue(op)

    def clear_outputs(self, job_id: str) -> asyncio.Future[None]:
        out, cursor = self._out(job_id), self._cursor(job_id)

        async def op() -> None:
            await self.redis.delete(out, cursor)

        return self._queue(op)

    def delete(self, job_ids: list[str]) -> asyncio.Future[None]:
        keys = [k for i in job_ids for k in (self._state(i), self._out(i), self._cursor(i))]
        owned = self._owned(self.node)

        async def op() -> None:
            for key in keys:  # one key per command: the keys of different jobs live on different slots
                await self.redis.delete(key)
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

    async def request_cancel(self, job_id: str) -> None:
        await self.redis.publish(self.cancel_channel, job_id)

    async def advance_cursor(self, job_id: str) -> list[Any]:
        ttl = self.retention + 86400  # outlives the job: its own keys expire after the retention
        items = await self.redis.eval(_ADVANCE, 2, self._out(job_id), self._cursor(job_id), ttl)
        return [json.loads(i) for i in items]


    # -- a dead node's jobs ------------------------------------------------------------------
    async def renew_lease(self) -> None:
        await self.redis.set(self._alive(self.node), "1", px=max(100, int(self.lease * 1000)))

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self.renew_lease()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the lease may lapse, and another node take the jobs
                log.warning("jobs: could not renew this node's lease: %s", exc)

    async def claim_orphans(self) -> list[Job]:
        """The unfinished jobs of nodes whose lease lapsed, now this node's (each taken by one node)."""
        head, tail = self._owned("*").split("*")
        claimed: list[Job] = []
        async for key in self.redis.scan_iter(match=self._owned("*"), count=1000):
            name = key.decode() if isinstance(key, bytes) else str(key)
            node = name[len(head):-len(tail)]
            if node == self.node:
                continue
            ids = await self.redis.eval(_CLAIM, 2, self._alive(node), name)
            for raw in ids:
                job = await self.fetch(raw.decode() if isinstance(raw, bytes) else str(raw))
                if job is not None and not job.final:
                    claimed.append(job)
            if ids:
                log.warning("jobs: node %s stopped renewing its lease; took over %d unfinished job(s)",
                            node, len(ids))
        return claimed


def connect_store(url: str, prefix: str, retention: float, lease: float) -> RedisJobStore:
    from .settings import connect

    client: aioredis.Redis = connect(url)  # type: ignore[assignment]
    return RedisJobStore(client, prefix, retention, lease)
