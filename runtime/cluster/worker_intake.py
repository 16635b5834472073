"""The cluster worker's intake: consumer groups, one reader per Redis Cluster slot, reclaim.

Part of QueueConsumer (runtime/cluster/worker.py describes the whole). A worker reads every queue
it can run with XREADGROUP, only as many entries as it has free slots and the function has room
for; entries a dead worker held go idle and are taken over with XAUTOCLAIM.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from typing import Any

import redis.asyncio as aioredis

from runtime.deployment import Deployment

from ..tasks import checkpoint
from .answers import ANSWER_SCRIPT
from .settings import REDIS_DOWN, Backoff, Keys, slot_of
from .wire import Call, WireError, call_id, decode_call, error_entry, origin
from .worker_run import _APPEND, Runner, log

__all__ = ("Intake",)

# KEYS: the invocation's `taken` key, its cancel marker; ARGV: this worker and entry ("WORKER
# ENTRY"), the key's TTL, a (dead) taker to take it from, or "". 1 when it is this worker's now,
# 0 when it was cancelled (nothing set), else the taker. The frontend deletes the key at the end.
# (SET NX first: an invocation nobody took yet, nearly every one, costs two commands, not three.)
_TAKEN = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
local taker = redis.call('GET', KEYS[1])
if taker and taker ~= ARGV[1] and taker ~= ARGV[3] then return taker end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""
Entry = tuple[str, dict[str, str]]  # a queue entry as read: its id, its fields

# Seconds a `taken` key outlives its invocation's deadline (other nodes' clocks may be behind).
TAKEN_MARGIN = 5

# Empty blocking reads (1 s each) after which a queue's own reader hands it back to its slot's.
_ALONE_IDLE_READS = 5


class Intake(Runner):
    """Takes entries off the queues for Runner to run."""

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
                    key = self.keys.queue(dep.key)
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
            self._outage()
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
        """Take over entries other (dead) workers held longer than claimIdleSeconds. Not just after
        Redis was unreachable: every entry went idle meanwhile and every heartbeat key expired, and
        the live workers need a heartbeat or two to say so again (`_outage`)."""
        backoff = Backoff()
        while True:
            await asyncio.sleep(self.claim_idle / 2)
            checkpoint()
            if time.monotonic() < self._reclaim_after:
                continue
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
                                                        if fields and call_id(entry_id, fields) not in self._held],
                                                  reclaimed=True)
                    finally:
                        self._slots.release(free - taken)
                    for entry_id in (reply[2] if len(reply) > 2 else []):   # deleted while pending
                        await self.redis.xack(key, Keys.GROUP, entry_id)
                backoff.reset()
            except REDIS_DOWN:
                self._outage()
                await backoff.sleep()
            except aioredis.ResponseError as exc:
                log.debug("reclaim: %s", exc)

    async def _take(self, key: str, entries: list[tuple[str, dict[str, str]]], *, reclaimed: bool) -> int:
        """Run these entries, one per slot the caller reserved (each released by _done_with); how many.
        Their cancel markers are checked in one round trip, once they are held: a cancel message that
        comes while the check is on its way is kept in `_cancelled`, so none falls in between.
        Exactly once: the same script records this worker as the invocation's taker (`taken`, one
        per invocation id, _TAKEN). An enqueue sent again through a Redis outage can queue an
        invocation twice: its second entry finds the first taken and is dropped; a reclaimed entry
        whose taker still lives (its heartbeat key is there) is left to it."""
        if reclaimed:
            entries = await self._still_pending(key, entries)
        runs: list[tuple[str, str, Call]] = []
        for entry_id, fields in entries:
            try:
                call = decode_call(entry_id, fields)
            except WireError as exc:   # malformed, or of another protocol version: never run
                self._refuse(key, entry_id, fields, exc)
                continue
            inv_id = call.id
            if inv_id in self._held:   # the same invocation queued twice, both read at once: run it once
                self._drop_entry(key, entry_id)
                continue
            self._hold(inv_id, key, entry_id)
            runs.append((inv_id, entry_id, call))
        started = 0
        try:
            takers = await asyncio.gather(*(self._claim(i, f"{self.id} {e}", c, "") for i, e, c in runs))
            for (inv_id, entry_id, call), taker in zip(runs, takers, strict=True):
                if taker not in (0, 1):
                    taker = await self._take_over(key, inv_id, entry_id, call, str(taker))
                if taker is None:
                    self._unhold(inv_id)
                    self._cancelled.discard(inv_id)
                    started += 1   # (counted as started: its slot is released here)
                    self._slots.release()
                    continue
                job = asyncio.create_task(self._run_entry(key, entry_id, call, reclaimed, taker == 0),
                                          name=f"worker-run-{inv_id}")
                self._jobs.add(job)
                job.add_done_callback(self._jobs.discard)
                started += 1
        except BaseException:
            for inv_id, _e, _f in runs[started:]:   # not taken after all: the caller releases their slots,
                self._unhold(inv_id)                # reclaim takes them
                self._cancelled.discard(inv_id)
            raise
        return started

    async def _still_pending(self, key: str, entries: list[Entry]) -> list[Entry]:
        """Reclaimed entries that are still to run. An XAUTOCLAIM Redis ran just before this worker's
        own XACK of an entry it had finished may return it once the worker let go of it (_held): run
        again, a JSON call would run twice (its answer is in its frontend's stream, so _should_run
        cannot tell) and set its `taken` guard again after the frontend deleted it. So none still
        finishing here, and none Redis no longer has pending (asked once its XACK was confirmed)."""
        entries = [(e, f) for e, f in entries if f.get("id", e) not in self._finishing]
        if not entries:
            return entries
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry_id, _ in entries:
                pipe.xpending_range(key, Keys.GROUP, min=entry_id, max=entry_id, count=1)
            pending = await pipe.execute()
        return [entry for entry, still in zip(entries, pending, strict=True) if still]

    async def _take_over(self, key: str, inv_id: str, entry_id: str, call: Call, taker: str) -> int | None:
        """Another worker is the invocation's taker: 1 once this one took it over from a dead one
        (0: it was cancelled meanwhile, the entry is only to be acked), None if it is not this one's."""
        worker, _, taken_entry = taker.partition(" ")
        if taken_entry != entry_id:   # another entry of the same invocation is the one that runs
            log.info("worker %s: dropping entry %s of invocation %s: queued twice, taken as %s",
                     self.id, entry_id, inv_id, taken_entry)
            self._drop_entry(key, entry_id)
            return None
        if await self.redis.exists(self.keys.worker(worker)):
            return None   # alive: it runs it, and its heartbeat claims the entry back
        took = await self._claim(inv_id, f"{self.id} {entry_id}", call, taker)
        return took if took in (0, 1) else None

    def _claim(self, inv_id: str, mine: str, call: Call, instead_of: str) -> asyncio.Future[Any]:
        return self.batch.call("EVAL", _TAKEN, 2, self.keys.taken(inv_id), self.keys.cancelled(inv_id), mine,
                               self._taken_ttl(call), instead_of)

    def _taken_ttl(self, call: Call) -> int:
        """Seconds a `taken` key lives: while its entry (or a second one of it) may still be taken."""
        left = call.deadline - time.time()
        return max(int(self.ttl), math.ceil(left) + TAKEN_MARGIN) if math.isfinite(left) else int(self.ttl)

    def _refuse(self, key: str, entry_id: str, fields: dict[str, str], exc: WireError) -> None:
        """A queue entry this worker will not run: logged, acked and dropped (not left to be reclaimed
        again and again), and answered with the refusal when it names its invocation, so its caller
        learns why at once rather than at its deadline (its frontend may not read it: another version)."""
        inv_id, reply = fields.get("id"), fields.get("reply")   # (what may be read of an entry refused)
        log.warning("worker %s: refusing entry %s of %s (invocation %s), not run: %s",
                    self.id, entry_id, key, inv_id, exc.message)
        self._drop_entry(key, entry_id)
        if not inv_id:
            return
        answer = {**error_entry(exc), **origin(self.id)}
        if reply:
            pairs = [x for item in {"id": inv_id, **answer}.items() for x in item]
            refused = self.batch.call("EVAL", ANSWER_SCRIPT, 1, reply, max(1, int(self.ttl)), *pairs)
        else:
            refused = self.batch.call("EVAL", _APPEND, *self._append_args(inv_id, [answer]))
        refused.add_done_callback(_ignore_outcome)

    def _drop_entry(self, key: str, entry_id: str) -> None:
        """Ack and delete an entry without running it (if Redis is down it stays pending: reclaimed, dropped)."""
        for call in (self._send(("XACK", key, Keys.GROUP, entry_id)), self._send(("XDEL", key, entry_id))):
            call.add_done_callback(_ignore_outcome)


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("worker: dropping a duplicate entry: %s", future.exception())
