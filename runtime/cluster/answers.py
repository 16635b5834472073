"""One reader of answers per frontend: the results of plain JSON invocations, off one Redis stream.

A JSON invocation relays no output, only its answer; a pump of its own (a task and a blocking
XREAD of the invocation's own stream, then a DEL of its keys) cost the frontend about a fifth of
each queued call. So the queue entry names the frontend's answers stream (`reply`,
`{answers:NODE}`), the worker XADDs the terminal entry there (`id` names the invocation; the
script gives a stream it creates a TTL, which the reader renews, so a dead frontend's stream
expires), and one task here reads every answer in batches, resolves each waiting invocation and
trims what it read (one XTRIM per batch, sent with whatever else the loop turn sends).

Deadlines are swept here twice a second (no answer `DEADLINE_GRACE` after the deadline:
FunctionTimeoutError, as the pump raises). Redis lost while reading is waited out, as each pump's
own read waits it out: a waiter fails only at its deadline (then ClusterUnavailableError); what
Redis refuses fails every waiter at once (the reader itself never stops on an error).
A worker of the version before does not know `reply`: the node names a reply stream only when
every live worker of the function announces that it answers there (runtime/cluster/node.py), and
since one may join or reclaim the entry after that choice, a call waiting 1, 2, 4, 8... s is also
looked for in its own stream.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import RedisError

from runtime.errors import FunctionServiceError, FunctionTimeoutError
from runtime.tasks import checkpoint, stop_tasks

from .batch import Batcher
from .settings import REDIS_DOWN, AnyRedis, Backoff, ClusterUnavailableError, Keys
from .wire import answer_of, entry_kind

if TYPE_CHECKING:
    from runtime.manifest import FunctionSpec

__all__ = ("AnswerReader", "Waiting", "ANSWER_SCRIPT", "DEADLINE_GRACE", "POLL_MS", "silent_worker_timeout")

log = logging.getLogger("fnstream.cluster")

# KEYS: the answers stream; ARGV: its TTL in seconds, then the entry's field/value pairs.
# A stream that exists has a TTL its reader renews (AnswerReader._read: it keeps the last entry,
# so the stream lives on): only the XADD that creates it sets one (NOMKSTREAM: Redis >= 6.2).
ANSWER_SCRIPT = """
if not redis.call('XADD', KEYS[1], 'NOMKSTREAM', '*', unpack(ARGV, 2)) then
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return 1
"""

# How long a blocking XREAD of the frontend's waits before it checks deadlines (and worker liveness).
POLL_MS = 500
# Extra time past the function's timeout before the frontend gives up on a silent worker.
DEADLINE_GRACE = 5.0
# Answers taken per read.
_BATCH = 100
# A call waiting this long (then 2, 4, 8... s) is also looked for in its own stream.
_FIRST_LOOK = 1.0


class Waiting(Protocol):
    """What the reader needs of an invocation waiting for its answer (queue.py's RemoteInvocation)."""

    id: str
    spec: FunctionSpec
    loop: asyncio.AbstractEventLoop
    started: float
    deadline: float

    def answered(self, fields: dict[str, str]) -> None: ...
    def give_up(self, error: FunctionServiceError, *, cancel: bool = True) -> None: ...


class AnswerReader:
    """Reads this frontend's answers stream and resolves the invocations waiting on it."""

    def __init__(self, redis: AnyRedis, keys: Keys, node: str, batch: Batcher, *, ttl: int) -> None:
        self.redis, self.keys, self.batch, self.ttl = redis, keys, batch, ttl
        self.key = keys.answers(node)
        self._waiting: dict[str, Waiting] = {}
        self._look_at: dict[str, float] = {}   # invocation id -> when to look in its own stream next
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def wait(self, inv: Waiting) -> asyncio.Future[str | None]:
        """Expect `inv`'s answer (before its queue entry is written: a fast worker may answer
        before the enqueue's reply is read); the future gets its JSON text or its error."""
        if self._closed:
            raise ClusterUnavailableError("this node is shutting down")
        if self._task is None or self._task.done():   # (done: only by a bug, which is logged)
            if self._task is not None and not self._task.cancelled() and self._task.exception() is not None:
                log.error("cluster answer reader ended: %r; restarted", self._task.exception())
            self._task = asyncio.get_running_loop().create_task(self._read(), name="cluster-answers")
        self._waiting[inv.id] = inv
        self._look_at[inv.id] = inv.started + _FIRST_LOOK
        return inv.loop.create_future()

    def forget(self, inv_id: str) -> None:
        self._waiting.pop(inv_id, None)
        self._look_at.pop(inv_id, None)

    async def close(self) -> None:
        """Stop reading: the reader ends after its current read (at most POLL_MS), so its connection
        goes back to the pool whole (a read cancelled midway leaves redis-py a socket half closed)."""
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), POLL_MS / 1000 + 1)
        await stop_tasks((task,), "cluster answer reader")
        self._fail_all(ClusterUnavailableError("this node is shutting down"))

    async def _read(self) -> None:
        """Until closed: read answers, resolve their invocations, sweep deadlines. It never ends on an
        error: what Redis refuses (an ACL without this key, a busy script...) fails the calls waiting
        now, with the reason, and the reader tries again after a pause."""
        last = "0-0"   # the stream is this node's alone and new with it
        backoff = Backoff()
        next_sweep = renew_at = 0.0
        while not self._closed:
            try:
                reply: Any = await self.redis.xread({self.key: last}, count=_BATCH, block=POLL_MS)
            except REDIS_DOWN as exc:
                # Waited out: the workers retry their answers too, and a Redis that keeps what it
                # acknowledged (AOF) still has those written before. Only a call past its deadline fails.
                self._sweep(time.monotonic(), down=exc)
                await backoff.sleep()
                continue
            except RedisError as exc:
                self._fail_all(ClusterUnavailableError(f"Redis refused to read this node's answers stream "
                                                       f"{self.key!r}: {exc}"))
                await backoff.sleep()
                continue
            backoff.reset()
            checkpoint()
            if reply:
                for entry_id, fields in reply[0][1]:
                    last = entry_id
                    self._resolve(answer_of(fields), fields)
                self._send("XTRIM", self.key, "MINID", last)   # all but the last: what was read
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + POLL_MS / 1000
                self._sweep(now)
            if now >= renew_at:   # the workers' writes renew it too; an idle frontend's must not expire
                renew_at = now + self.ttl / 3
                self._send("EXPIRE", self.key, self.ttl)

    def _resolve(self, inv_id: str, fields: dict[str, str]) -> None:
        inv = self._waiting.pop(inv_id, None)
        self._look_at.pop(inv_id, None)
        if inv is not None:   # else it was cancelled or timed out meanwhile
            inv.answered(fields)

    def _send(self, *args: Any) -> None:
        """A command that needs no reply, sent with the loop turn's others (its failure is harmless)."""
        self.batch.call(*args).add_done_callback(_ignore_outcome)

    def _sweep(self, now: float, down: BaseException | None = None) -> None:
        """Give up on invocations whose worker stayed silent past their deadline (`down`: Redis is
        unreachable, so that is why); look for the answers of those waiting long in their own streams."""
        for inv in [i for i in self._waiting.values() if now > i.deadline + DEADLINE_GRACE]:
            self.forget(inv.id)
            if down is None:
                inv.give_up(silent_worker_timeout(inv.spec))
            else:
                inv.give_up(ClusterUnavailableError(f"lost the connection to Redis while waiting for an answer "
                                                    f"from the cluster's workers: {down}"), cancel=False)
        if down is not None:
            return
        for inv_id in [i for i, at in self._look_at.items() if at <= now]:
            inv = self._waiting[inv_id]
            self._look_at[inv_id] = now + (now - inv.started)   # at 1, 2, 4, 8... s: a long call costs little
            look = self.batch.call("XREVRANGE", self.keys.output(inv_id), "+", "-", "COUNT", 1)
            look.add_done_callback(functools.partial(self._looked, inv_id))

    def _looked(self, inv_id: str, look: asyncio.Future[Any]) -> None:
        """A worker that took the entry without knowing `reply` (of the version before, joining or
        reclaiming after the node chose the answers stream) wrote the answer to the invocation's own
        stream: take it from there, and drop that stream."""
        if look.cancelled() or look.exception() is not None or not look.result():
            return
        _entry_id, fields = look.result()[0]
        if entry_kind(fields) in ("result", "error") and inv_id in self._waiting:
            self._resolve(inv_id, fields)
            self._send("DEL", self.keys.output(inv_id))

    def _fail_all(self, error: FunctionServiceError) -> None:
        waiting, self._waiting, self._look_at = self._waiting, {}, {}
        for inv in waiting.values():
            inv.give_up(error, cancel=False)


def silent_worker_timeout(spec: FunctionSpec) -> FunctionTimeoutError:
    """What a client gets when no worker answered by the deadline (plus DEADLINE_GRACE)."""
    return FunctionTimeoutError(f"function {spec.name!r} timed out after {spec.timeout:g} s "
                                "(no answer from the cluster's workers)")


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("cluster answers: %s", future.exception())
