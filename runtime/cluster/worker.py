"""The work queue, worker side: take invocations with consumer groups, run them, stream the output.

A worker reads every function queue it can run (XREADGROUP, only as many entries as it has free
slots and the function has room for: `concurrency` is per instance, so what one worker cannot
start yet stays queued for another; one reader per Redis Cluster slot, since a multi-key read must
stay on one slot, so on a single Redis one reader covers every queue), runs each invocation with the ordinary
Executor and writes its output stream. While it lives it refreshes a heartbeat key and resets the
idle time of the entries it holds; entries of a dead worker go idle and another worker takes them
with XAUTOCLAIM. A reclaimed invocation whose output had already begun is not run again: the
client gets a "worker lost" error instead.
Cancellations arrive on a pub/sub channel and as a key, checked before starting and by every
output write (one script): once the frontend dropped an invocation's keys, a late write cannot recreate them.

Round trips are what a queued invocation costs (far more CPU on either side than Redis spends),
so they are few and shared: every command goes through one Batcher (runtime/cluster/batch.py: the
commands of one loop turn in one pipeline); the worker's id rides on the first entry written (no
entry of its own); a batch of stream writes is one output entry (`d` the payloads end to end, `n` their lengths);
the terminal entry, XACK and XDEL are issued together, in that order.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from typing import Any, cast, get_args

import redis.asyncio as aioredis
from redis.typing import EncodableT, StreamIdT

from runtime.deployment import Deployment
from runtime.errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError
from runtime.executor import Executor
from runtime.invocation import Invocation, Item
from runtime.registry import Registry
from runtime.surface import Mode

from ..tasks import checkpoint, stop_tasks
from .answers import ANSWER_SCRIPT
from .batch import Batcher
from .settings import REDIS_DOWN, AnyRedis, Backoff, Keys, WorkerLostError, slot_of

__all__ = ("QueueWorker",)

log = logging.getLogger("fnstream.cluster")

# KEYS: output stream, cancel marker; ARGV: ttl, then per entry its field count * 2 and the pairs.
# One script so the check and the writes are atomic: the frontend's cancel cannot fall in between.
_APPEND = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local i = 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""


class _Window:
    """How far a worker may run ahead of the frontend's pump: two buffers of characters (when the
    invocation's channel is bounded in bytes) and eight of events: it waits before a batch once that
    much is unread, so Redis holds under three buffers of bytes (a batch is at most one; a single
    larger write alone). Events are many and small: a waiting worker looks again every few ms, so
    the event window is what bounds a fast stream's rate (two buffers: ~100k events/s).
    The pump acks events (`{inv:ID}:ack`) and characters (`{inv:ID}:ackc`) and trims what it read;
    a frontend of the version before acks only events, and is then paced by events alone."""

    def __init__(self, events: int, max_bytes: int | None) -> None:
        self.max_events, self.max_chars = 8 * events, None if max_bytes is None else 2 * max_bytes
        self.written_events = self.written_chars = self.acked_events = self.acked_chars = 0

    def full(self) -> bool:
        if self.written_events - self.acked_events >= self.max_events:
            return True
        return self.max_chars is not None and self.written_chars - self.acked_chars >= self.max_chars

    def wrote(self, events: int, chars: int) -> None:
        self.written_events += events
        self.written_chars += chars

    def acked(self, events: str | bytes | None, chars: str | bytes | None) -> None:
        self.acked_events = int(events or 0)
        if chars is None and self.acked_events:
            self.max_chars = None  # acked events and no characters: an older frontend
        self.acked_chars = int(chars or 0)


# Empty blocking reads (1 s each) after which a queue's own reader hands it back to its slot's.
_ALONE_IDLE_READS = 5


class _Slots:
    """A worker's free invocation slots, and a wake-up for readers waiting for one. A blocking read
    reserves none: it waits until one is free and takes one an entry when they come, so when
    several queues' entries come at once `free` may go below zero (by one an entry) until they end."""

    def __init__(self, n: int) -> None:
        self.free = n
        self.freed = asyncio.Event()

    async def until_free(self) -> None:
        while self.free <= 0:
            self.freed.clear()
            await self.freed.wait()

    def reserve(self, most: int) -> int:
        """Up to `most` of the slots free now (possibly none)."""
        n = max(0, min(most, self.free))
        self.free -= n
        return n

    def release(self, n: int = 1) -> None:
        self.free += n
        if n > 0:
            self.freed.set()


class QueueWorker:
    """Runs queued invocations of the functions in `registry` on `executor` (not a worker process:
    those are runtime/process; this is a cluster node's consumer of the work queue)."""

    def __init__(self, redis: AnyRedis, keys: Keys, registry: Registry, executor: Executor, worker_id: str, *,
                 concurrency: int = 64, heartbeat: float = 1.0, claim_idle: float = 5.0, ttl: float = 60.0) -> None:
        self.redis, self.keys, self.registry, self.executor = redis, keys, registry, executor
        self.id = worker_id
        self.concurrency = concurrency
        self.heartbeat, self.claim_idle, self.ttl = heartbeat, claim_idle, ttl
        self._slots = _Slots(concurrency)
        self._running: dict[str, Invocation] = {}          # invocation id -> Invocation
        self._held: dict[str, tuple[str, str]] = {}        # invocation id -> (queue key, entry id)
        self._held_of: dict[str, int] = {}                 # queue key -> entries held of it
        self._left_out: set[str] = set()                   # queues a slot's reader left out: no room
        self._cancelled: set[str] = set()                  # held, not yet running, cancel message seen
        self._grouped: set[str] = set()
        self._by_slot: dict[int, list[str]] = {}           # cluster slot -> queue keys read together
        self._function_of: dict[str, Deployment] = {}      # queue key -> the function it queues
        self._readers: dict[int, asyncio.Task[Any]] = {}
        self._alone: dict[str, asyncio.Task[Any]] = {}     # queue key -> its own reader (see _read_alone)
        self._tasks: list[asyncio.Task[Any]] = []
        self._jobs: set[asyncio.Task[Any]] = set()
        self.completed = 0
        self.taking = True  # False once shutting down: it serves no function, what it runs goes on
        self.batch = Batcher(redis)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for coro, name in ((self._supervise(), "queues"), (self._beat(), "heartbeat"),
                           (self._reclaim(), "reclaim"), (self._listen_cancel(), "cancel")):
            self._tasks.append(asyncio.create_task(coro, name=f"worker-{name}"))

    async def stop_taking(self) -> None:
        """Read no more entries (readers, queue supervision and reclaim stop); what runs goes on,
        with its heartbeat and cancellations, until `stop`."""
        self.taking = False
        intake = [t for t in self._tasks if t.get_name() in ("worker-queues", "worker-reclaim")]
        intake += [*self._readers.values(), *self._alone.values()]
        await stop_tasks(intake, "cluster worker intake")
        try:
            await self._announce()  # frontends stop queueing for it now, not at the next heartbeat
        except REDIS_DOWN:
            pass

    async def stop(self) -> None:
        self.taking = False   # (stop_taking usually came first) no reader starts from here on
        self._cancel_running()
        await stop_tasks((*self._tasks, *self._readers.values(), *self._alone.values()), "cluster worker")
        self._cancel_running()  # and any a reader started meanwhile
        if self._jobs:  # a cancelled invocation still writes its end (the client's error event): let it
            await asyncio.wait(list(self._jobs), timeout=5)
        await stop_tasks(self._jobs, "cluster worker invocations")
        try:
            await self.redis.delete(self.keys.worker(self.id))
        except REDIS_DOWN:
            pass

    def _cancel_running(self) -> None:
        for inv in list(self._running.values()):
            inv.cancel("worker shutting down")

    # -- taking work -------------------------------------------------------------------------
    async def _create_group(self, key: str) -> None:
        try:
            await self.redis.xgroup_create(key, Keys.GROUP, id="0", mkstream=True)
        except aioredis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._grouped.add(key)

    async def _supervise(self) -> None:
        """Keep a consumer group on every queue this node can run, and one reader per slot holding them."""
        backoff = Backoff()
        while True:
            try:
                by_slot: dict[int, list[str]] = {}
                functions: dict[str, Deployment] = {}
                for dep in self.registry.list():
                    key = self.keys.queue(dep.name)
                    if key not in self._grouped:
                        await self._create_group(key)
                    by_slot.setdefault(slot_of(self.redis, key), []).append(key)
                    functions[key] = dep
                    # a slot given back without an entry ending here: a `def` thread that ran on
                    # after its call was cancelled, a `role: all` node's own call
                    dep.on_release = functools.partial(self._room_back, key)
                self._by_slot, self._function_of = by_slot, functions
                self._left_out.intersection_update(functions)   # not what is no longer deployed here
                for key in [k for k, n in self._held_of.items() if n == 0 and k not in functions]:
                    del self._held_of[key]
                backoff.reset()
                checkpoint()
            except REDIS_DOWN as exc:
                log.warning("worker %s: Redis unreachable (%s); retrying", self.id, exc)
                self._grouped.clear()
                await backoff.sleep()
                continue
            except aioredis.ResponseError as exc:   # e.g. READONLY in a failover, NOPERM: it must not end
                log.warning("worker %s: cannot keep the queues' consumer groups (%s); retrying", self.id, exc)
                await backoff.sleep()
                continue
            for slot in by_slot:
                if slot not in self._readers or self._readers[slot].done():
                    self._readers[slot] = asyncio.create_task(self._read_slot(slot), name=f"worker-read-{slot}")
            await asyncio.sleep(self.heartbeat)

    def _room(self, key: str) -> int:
        """Entries of this queue the worker may take now: its function's `concurrency` (per instance)
        less what runs or waits here. A worker holds no entry it cannot start while another worker
        could: a CPU-bound function's queue spreads over the workers instead of piling up on one."""
        dep = self._function_of.get(key)
        if dep is None:
            return 0
        return dep.spec.concurrency - max(dep.inflight, self._held_of.get(key, 0))

    def _hold(self, inv_id: str, key: str, entry_id: str) -> None:
        self._held[inv_id] = (key, entry_id)
        self._held_of[key] = self._held_of.get(key, 0) + 1

    def _unhold(self, inv_id: str) -> tuple[str, str] | None:
        held = self._held.pop(inv_id, None)
        if held is not None:
            self._held_of[held[0]] -= 1
            self._room_back(held[0])
        return held

    def _room_back(self, key: str) -> None:
        """An entry of this queue ended, or its function gave a slot back: a queue its slot's reader
        left out for want of room gets a read of its own now (that blocked read cannot be told)."""
        if key in self._left_out and self.taking and key not in self._alone and self._room(key) > 0:
            self._alone[key] = asyncio.get_running_loop().create_task(self._read_alone(key),
                                                                      name=f"worker-read-{key}")

    async def _read_slot(self, slot: int) -> None:
        """Take entries from the queues of one slot (one read for all of them), never more than this
        worker has free slots, nor more of a queue than its function has room for here. A queue at
        its function's concurrency is left out, and once it has room again it is read by a reader of
        its own (_read_alone): a blocked read cannot be told to read one more queue."""
        backoff = Backoff()
        wait = True
        while keys := self._by_slot.get(slot):
            if wait:
                await self._slots.until_free()   # its slot is taken when its entry comes (see _Slots)
            checkpoint()
            rooms = {k: self._room(k) for k in keys if k not in self._alone}
            self._left_out.update(k for k, room in rooms.items() if room <= 0)
            read = {k: room for k, room in rooms.items() if room > 0}
            if not read:   # each function here is at its concurrency (or read alone): wait for one to end
                self._slots.freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slots.freed.wait(), self.heartbeat)
                wait = True
                continue
            if wait:
                n, count = 0, 1
            else:
                n = self._slots.reserve(min(read.values()))
                if n == 0:
                    wait = True
                    continue
                count = max(1, n // len(read))   # COUNT is per queue: all of them together about n
            self._left_out.difference_update(read)
            taken = await self._read(keys, read, count, n, backoff, block=wait)
            wait = taken < max(n, 1)   # a full batch: more may be waiting, read again at once
        self._readers.pop(slot, None)

    async def _read_alone(self, key: str) -> None:
        """Read one queue whose function was at its concurrency when the slot's reader last looked,
        until it is there again (then the next entry that ends here starts another), is gone, or
        has had nothing for a few blocks (then the slot's reader takes it back: an idle queue costs
        no connection of its own; its next entry may wait for the slot's current block, 1 s)."""
        backoff = Backoff()
        idle = 0
        saturated = False
        try:
            while self.taking and idle < _ALONE_IDLE_READS:
                await self._slots.until_free()
                checkpoint()
                room = self._room(key)   # after the wait: the function may be gone (0) or full again
                if room <= 0:
                    saturated = True
                    return
                if await self._read([key], {key: room}, 1, 0, backoff, block=True) == 0:
                    idle += 1
                    continue
                idle = 0
                n = self._slots.reserve(self._room(key))
                if n:
                    await self._read([key], {key: n}, n, n, backoff, block=False)
        finally:
            self._alone.pop(key, None)
            if saturated:   # the next entry of it that ends here reads on
                self._left_out.add(key)

    async def _read(self, keys: list[str], read: dict[str, int], count: int, n: int, backoff: Backoff, *,
                    block: bool) -> int:
        """One XREADGROUP of the queues in `read`, `count` entries of each at most, with `n` slots
        reserved (0 for a blocking read: each entry takes its slot as it comes); how many it took."""
        taken = 0
        try:
            reply: Any = await self.redis.xreadgroup(Keys.GROUP, self.id, {k: ">" for k in read}, count=count,
                                                     block=1000 if block else None)
            backoff.reset()
            checkpoint()  # before taking: what was read stays pending, for another worker to reclaim
            for key, entries in reply or []:
                taken += await self._take(key, entries, reclaimed=False)
        except REDIS_DOWN as exc:
            log.warning("worker %s: Redis unreachable (%s); retrying", self.id, exc)
            self._grouped.clear()
            await backoff.sleep()
        except aioredis.ResponseError as exc:
            try:
                if "NOGROUP" in str(exc):   # the queue was deleted (e.g. Redis restarted empty)
                    for key in keys:
                        await self._create_group(key)
                else:   # e.g. READONLY during a failover: the reader goes on after a pause
                    log.warning("worker %s: reading %s: %s; retrying", self.id, ", ".join(read), exc)
                    await backoff.sleep()
            except (*REDIS_DOWN, aioredis.ResponseError) as again:
                log.warning("worker %s: recreating %s: %s; retrying", self.id, ", ".join(keys), again)
                await backoff.sleep()
        finally:
            self._slots.release(n - taken)
        return taken

    async def _reclaim(self) -> None:
        """Take over entries other (dead) workers held longer than claimIdleSeconds."""
        backoff = Backoff()
        while True:
            await asyncio.sleep(self.claim_idle / 2)
            checkpoint()
            try:
                for key in list(self._grouped):
                    free = self._slots.reserve(self._slots.free)   # reclaim is rare: every free slot
                    if free <= 0:
                        break
                    taken = 0
                    try:
                        reply = await self.redis.xautoclaim(key, Keys.GROUP, self.id, int(self.claim_idle * 1000),
                                                            "0-0", count=free)
                        # Not one it runs itself: a stalled loop can let its own entries go idle.
                        taken += await self._take(key, [(entry_id, fields) for entry_id, fields in reply[1]
                                                        if fields and fields.get("id", entry_id) not in self._held],
                                                  reclaimed=True)
                    finally:
                        self._slots.release(free - taken)
                    for entry_id in (reply[2] if len(reply) > 2 else []):   # deleted while pending
                        await self.redis.xack(key, Keys.GROUP, entry_id)
                backoff.reset()
            except REDIS_DOWN:
                await backoff.sleep()
            except aioredis.ResponseError as exc:
                log.debug("reclaim: %s", exc)

    async def _take(self, key: str, entries: list[tuple[str, dict[str, str]]], *, reclaimed: bool) -> int:
        """Run these entries, one per slot the caller reserved (each released by _done_with); how many.
        Their cancel markers are checked in one round trip, once they are held: a cancel message that
        comes while the check is on its way is kept in `_cancelled`, so none falls in between."""
        ids = [fields.get("id", entry_id) for entry_id, fields in entries]
        for inv_id, (entry_id, _) in zip(ids, entries, strict=True):
            self._hold(inv_id, key, entry_id)
        try:
            marks = await asyncio.gather(*(self.batch.call("EXISTS", self.keys.cancelled(i)) for i in ids))
        except BaseException:
            for inv_id in ids:   # not taken after all: the caller releases their slots, reclaim takes them
                self._unhold(inv_id)
                self._cancelled.discard(inv_id)
            raise
        for inv_id, (entry_id, fields), marked in zip(ids, entries, marks, strict=True):
            job = asyncio.create_task(self._run_entry(key, entry_id, fields, reclaimed, bool(marked)),
                                      name=f"worker-run-{inv_id}")
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)
        return len(entries)

    async def _done_with(self, inv_id: str, terminal: list[dict[str, str]] | None = None,
                         reply: str | None = None) -> None:
        """Release the slot, write the invocation's `terminal` entry (if any: to its frontend's answers
        stream `reply` when the entry names one, runtime/cluster/answers.py), ack and delete its queue
        entry: issued together and sent in this order, so an entry is never acked before its answer is stored."""
        held = self._unhold(inv_id)
        assert held is not None
        key, entry_id = held
        self._cancelled.discard(inv_id)
        self._slots.release()
        calls: list[asyncio.Future[Any]] = []
        if terminal and reply:
            pairs = [x for name, value in {"id": inv_id, **terminal[-1]}.items() for x in (name, value)]
            calls.append(self.batch.call("EVAL", ANSWER_SCRIPT, 1, reply, max(1, int(self.ttl)), *pairs))
        elif terminal:
            calls.append(self.batch.call("EVAL", _APPEND, *self._append_args(inv_id, terminal)))
        calls += [self.batch.call("XACK", key, Keys.GROUP, entry_id), self.batch.call("XDEL", key, entry_id)]
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            # Redis down: it stays pending; whoever reclaims it finds a streaming call's finished output
            # and just acks it. A JSON call's answer went to its frontend (which already dropped the
            # call's own stream before this change too): it runs again, and its second answer is dropped.
            if isinstance(outcome, Exception) and not isinstance(outcome, REDIS_DOWN):
                log.warning("worker %s: finishing invocation %s: %s", self.id, inv_id, outcome)

    # -- running -----------------------------------------------------------------------------
    async def _run_entry(self, key: str, entry_id: str, fields: dict[str, str], reclaimed: bool,
                         cancelled: bool) -> None:
        inv_id = fields.get("id", entry_id)
        terminal: list[dict[str, str]] | None = None
        try:
            if not cancelled and inv_id not in self._cancelled and await self._should_run(inv_id, fields, reclaimed):
                terminal = await self._execute(inv_id, fields)
        except REDIS_DOWN as exc:
            # Leave the entry pending and stop touching it: once idle it is reclaimed (and re-run if
            # no output went out, else answered with "worker lost").
            log.warning("worker %s: lost Redis while running %s: %s", self.id, inv_id, exc)
            inv = self._running.get(inv_id)
            if inv is not None:
                inv.cancel("lost the connection to Redis")
            self._unhold(inv_id)
            self._cancelled.discard(inv_id)
            self._slots.release()
            return
        except Exception:
            log.exception("worker %s: invocation %s failed", self.id, inv_id)
        finally:
            self._running.pop(inv_id, None)
            self.completed += 1
        await self._done_with(inv_id, terminal, fields.get("reply"))

    async def _should_run(self, inv_id: str, fields: dict[str, str], reclaimed: bool) -> bool:
        """False when there is nothing to run, only the entry to ack: (reclaimed) already answered,
        or answered here with "worker lost" since its output had begun. (Cancelled while queued:
        the caller checked the marker.)"""
        if reclaimed:
            last: Any = await self.redis.xrevrange(self.keys.output(inv_id), count=1)
            kind = last[0][1].get("t") if last else None
            if kind in ("result", "error"):
                return False  # finished, only the ack was lost
            if kind == "data":
                err = WorkerLostError(f"the worker running {fields.get('function')!r} was lost after its "
                                      "output began; the invocation was not retried")
                await self._write(inv_id, [self._error_fields(err)])
                return False
            log.info("worker %s: re-running invocation %s taken over from a lost worker", self.id, inv_id)
        return True

    def _error_fields(self, exc: FunctionServiceError) -> dict[str, str]:
        return {"t": "error", "code": str(exc.code), "status": str(exc.status), "message": exc.message}

    def _append_args(self, inv_id: str, entries: list[dict[str, str]]) -> list[EncodableT]:
        """The _APPEND script's key count, KEYS and ARGV for these entries."""
        args: list[EncodableT] = [2, self.keys.output(inv_id), self.keys.cancelled(inv_id), max(1, int(self.ttl))]
        for fields in entries:
            args.append(len(fields) * 2)
            for name, value in fields.items():
                args += (name, value)
        return args

    async def _write(self, inv_id: str, entries: list[dict[str, str]]) -> bool:
        """Append to the output stream and renew its TTL; False (nothing written) once the frontend
        cancelled: it deleted the keys, and a late write would recreate them until they expire.
        (EVAL, not EVALSHA: in a pipeline a missing script would fail with no retry; Redis caches it.)"""
        return bool(await self.batch.call("EVAL", _APPEND, *self._append_args(inv_id, entries)))

    async def _execute(self, inv_id: str, fields: dict[str, str]) -> list[dict[str, str]] | None:
        """Run it, writing its stream as it goes; returns its terminal entry, which _done_with writes
        with the queue ack (None: nothing to write, the client is gone)."""
        name = fields.get("function", "")
        first = {"w": self.id}   # which worker runs it: on the first entry written, wherever that is
        try:
            dep = self.registry.get(name)
            if time.time() > float(fields.get("deadline", "inf")):
                raise FunctionTimeoutError(f"function {name!r} timed out before a worker could take it")
            mode: Mode = next((m for m in get_args(Mode) if m == fields.get("mode")), "json")
            inv = Invocation(dep, json.loads(fields.get("event", "{}")), mode=mode,
                             loop=asyncio.get_running_loop(), buffer_events=int(fields.get("buffer", 100)),
                             max_write_size=int(fields.get("maxWrite", 4 * 1024 * 1024)),
                             max_response_size=int(fields.get("maxResponse", 6 * 1024 * 1024)),
                             trace_id=fields.get("trace"), keep_items=fields.get("items") == "1",
                             buffer_bytes=int(fields["bufferBytes"]) if "bufferBytes" in fields else None)
            inv.id = inv_id
            inv.deadline = min(inv.deadline, time.monotonic() + float(fields.get("deadline", "inf")) - time.time())
            if not await self._start_when_free(inv, inv_id):
                return None
        except FunctionServiceError as exc:
            return [{**self._error_fields(exc), **first}]
        self._running[inv_id] = inv
        if inv.streaming:
            first = await self._write_output(inv, inv_id, first)
        try:
            terminal = {"t": "result", "d": await inv.encoded_result() or ""}
        except asyncio.CancelledError:
            if inv.cancel_reason is None:
                raise
            task = asyncio.current_task()
            if task is not None and inv.task is task:
                task.uncancel()   # a JSON call ran in this task: the cancel was its, not ours
            return None  # the client is gone: nobody reads the output
        except FunctionServiceError as exc:
            terminal = self._error_fields(exc)
        return [{**terminal, **first}]

    async def _write_output(self, inv: Invocation, inv_id: str, first: dict[str, str]) -> dict[str, str]:
        """Relay a streaming invocation's writes to its output stream as they come, within the
        frontend's window; returns `first` if nothing was written (the worker id is still to tell)."""
        if inv_id in self._cancelled:   # its cancel message came while it was being set up
            inv.cancel("cancelled")
        window = _Window(inv.channel.capacity, inv.channel.max_bytes)
        while True:
            batch = await inv.channel.get_batch()
            if not batch:
                return first
            lengths = [len(p) for p in batch]
            pause = 0.002
            stalled_since = time.monotonic()
            while window.full() and inv.cancel_reason is None:
                acked = window.acked_events, window.acked_chars
                window.acked(*await self.redis.mget(self.keys.ack(inv_id), self.keys.ack_chars(inv_id)))
                if window.full():
                    now = time.monotonic()
                    if (window.acked_events, window.acked_chars) != acked:
                        stalled_since = now  # the frontend reads on: slowly
                    elif now - stalled_since > self.ttl:
                        # No ack for as long as the invocation's keys live. A frontend whose client
                        # stalls renews the output stream's TTL while it waits; if the stream expired,
                        # nobody did: its frontend is gone (killed, or cut off from Redis).
                        if not await self.redis.exists(self.keys.output(inv_id)):
                            log.warning("worker %s: stopping invocation %s: its frontend stopped reading its "
                                        "output (none read, nor its TTL renewed, for %g s: "
                                        "cluster.outputTtlSeconds)", self.id, inv_id, self.ttl)
                            inv.cancel("its frontend stopped reading")
                            break
                        stalled_since = now  # its client is slow: look again a TTL later
                    await asyncio.sleep(pause)
                    pause = min(0.05, pause * 1.5)  # a client that stalls costs Redis less and less
            # One entry for the batch, its payloads in one field: a command argument costs the client
            # far more than its bytes do, so a batch of any size is four of them.
            entry = {"t": "data", **first, "i": str(window.written_events),  # its first event's index
                     "n": ",".join(map(str, lengths)), "d": "".join(batch)}
            if inv.keep_items:  # which writes' values are their JSON (RemoteInvocation._relay)
                entry["v"] = "".join("j" if isinstance(p, Item) and p.value is not p else "s" for p in batch)
            first = {}
            if not await self._write(inv_id, [entry]):
                inv.cancel("cancelled")  # the frontend gave up: stop now, even if its message is late
            window.wrote(len(batch), sum(lengths))

    async def _start_when_free(self, inv: Invocation, inv_id: str) -> bool:
        """Start it; a queued invocation waits for a free concurrency slot (False: cancelled meanwhile).

        A plain JSON call runs in this task when its result is awaited (Executor.start's `inline`:
        one task less per call); nothing awaits between here and then, so a cancel message that
        came before it started is seen here or not at all before it runs."""
        waited = 0
        while True:
            if inv_id in self._cancelled:
                return False
            try:
                self.executor.start(inv, inline=True)
                return True
            except ConcurrencyLimitError:
                if inv.remaining() <= 0:
                    raise FunctionTimeoutError(f"function {inv.spec.name!r} timed out waiting for a free slot "
                                               f"(concurrency {inv.spec.concurrency})") from None
                waited += 1
                if waited % 25 == 0 and await self.redis.exists(self.keys.cancelled(inv_id)):
                    return False
                await asyncio.sleep(0.02)

    # -- liveness and cancellation -----------------------------------------------------------
    async def _announce(self) -> None:
        """Refresh this worker's key: alive, and which functions it takes (none while shutting down)."""
        functions = [d.name for d in self.registry.list()] if self.taking else []
        info = json.dumps({"running": len(self._running), "completed": self.completed, "functions": functions,
                           "answers": 1})   # puts JSON answers on the frontend's answers stream (`reply`)
        await self.redis.set(self.keys.worker(self.id), info, px=int(self.heartbeat * 3000))

    async def _beat(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self._announce()
                by_queue: dict[str, list[StreamIdT]] = {}
                for key, entry_id in list(self._held.values()):
                    by_queue.setdefault(key, []).append(entry_id)
                for key, ids in by_queue.items():   # reset idle time: these are alive, not to be reclaimed
                    await self.redis.xclaim(key, Keys.GROUP, self.id, 0, ids, justid=True)
                backoff.reset()
                checkpoint()
                await asyncio.sleep(self.heartbeat)
            except REDIS_DOWN:
                await backoff.sleep()

    async def _listen_cancel(self) -> None:
        backoff = Backoff()
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.cancel_channel)
                backoff.reset()
                while True:
                    msg = await pubsub.get_message(timeout=5.0)
                    checkpoint()
                    if msg is None:
                        continue
                    inv_id: str = msg["data"]
                    inv = self._running.get(inv_id)
                    if inv is None and inv_id in self._held:
                        self._cancelled.add(inv_id)   # taken, not running yet: _execute checks this
                    elif inv is not None:
                        reason = cast("str | None", await self.redis.get(self.keys.cancelled(inv_id))) or "cancelled"
                        inv.cancel(reason)
            except REDIS_DOWN:
                await backoff.sleep()
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
