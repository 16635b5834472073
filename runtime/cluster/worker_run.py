"""The cluster worker's state, and running what it took: execute, stream the output, answer, ack.

Part of QueueConsumer (runtime/cluster/worker.py, which describes the whole): the base of the
intake (runtime/cluster/worker_intake.py) and of the worker itself. Round trips are few and
shared: every command goes through one Batcher; the worker's id rides on the first entry
written; a batch of stream writes is one output entry (`d` the payloads end to end, `n` their
lengths); the terminal entry, XACK and XDEL are issued together, in that order.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from redis.typing import EncodableT

from runtime.codec import Item
from runtime.deployment import Deployment
from runtime.errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError
from runtime.executor import Executor
from runtime.invocation import Invocation
from runtime.registry import Registry

from .answers import ANSWER_SCRIPT
from .batch import Batcher
from .settings import REDIS_DOWN, AnyRedis, Backoff, Keys, WorkerLostError, through_outage
from .wire import Call, data_entry, decode_ack, entry_kind, error_entry, origin, result_entry

__all__ = ("Runner",)

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
    invocation's channel is bounded in bytes) and 32 of events: it waits before a batch once that
    much is unread, so Redis holds under three buffers of bytes (a batch is at most one; a single
    larger write alone). Events are many and small, and the bytes bound Redis's memory: a waiting
    worker looks again every few ms, so an event window of eight buffers held a fast stream to
    ~120k events/s; at 32 it is the frontend's and Redis's CPU that does. Without a bound in bytes
    (a frontend of the version before acks events only, and may send no byte bound) the window
    stays eight buffers of events, the bound that frontend was built with.
    The pump acks events (`{inv:ID}:ack`) and characters (`{inv:ID}:ackc`) and trims what it read;
    a frontend of the version before acks only events, and is then paced by events alone."""

    def __init__(self, events: int, max_bytes: int | None) -> None:
        self.events, self.max_chars = events, None if max_bytes is None else 2 * max_bytes
        self.written_events = self.written_chars = self.acked_events = self.acked_chars = 0

    @property
    def max_events(self) -> int:
        """32 buffers while the bytes bound Redis; eight when the events alone do, as before."""
        return (8 if self.max_chars is None else 32) * self.events

    def full(self) -> bool:
        if self.written_events - self.acked_events >= self.max_events:
            return True
        return self.max_chars is not None and self.written_chars - self.acked_chars >= self.max_chars

    def wrote(self, events: int, chars: int) -> None:
        self.written_events += events
        self.written_chars += chars

    def acked(self, events: str | bytes | None, chars: str | bytes | None) -> None:
        self.acked_events, acked_chars = decode_ack(events, chars)
        if acked_chars is None and self.acked_events:
            self.max_chars = None  # acked events and no characters: an older frontend
        self.acked_chars = acked_chars or 0



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



class Runner:
    """A cluster worker's shared state (what it holds, runs, was told to cancel) and the running of
    the entries it took. Not used alone: QueueConsumer is the whole worker."""

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
        self._finishing: set[str] = set()                  # ended, its answer and ack not yet confirmed
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
        self._reclaim_after = 0.0                          # time.monotonic(): see _outage
        self._deadlines: dict[str, float] = {}             # invocation id -> its deadline (time.monotonic())


    def _hold(self, inv_id: str, key: str, entry_id: str) -> None:
        self._held[inv_id] = (key, entry_id)
        self._held_of[key] = self._held_of.get(key, 0) + 1

    def _unhold(self, inv_id: str) -> tuple[str, str] | None:
        held = self._held.pop(inv_id, None)
        if held is not None:
            self._held_of[held[0]] -= 1
            self._room_back(held[0])
        return held

    def _outage(self) -> None:
        """Redis was unreachable just now: no reclaim until the live workers have had the time to
        renew their heartbeat keys and claim back their entries (a heartbeat or two, then some)."""
        self._reclaim_after = time.monotonic() + self.claim_idle + 4 * self.heartbeat

    def _until(self, inv_id: str) -> float:
        """When (time.monotonic()) to stop retrying the invocation's commands through an outage."""
        return self._deadlines.get(inv_id) or time.monotonic() + self.ttl

    def _room_back(self, key: str) -> None:
        """An entry of queue `key` ended here (the intake reads that queue again if it left it out)."""

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
        self._finishing.add(inv_id)  # until its XACK is confirmed: a reclaim must not take it (Intake._take)
        try:
            await self._finish(inv_id, key, entry_id, terminal, reply)
        finally:
            self._finishing.discard(inv_id)

    async def _finish(self, inv_id: str, key: str, entry_id: str, terminal: list[dict[str, str]] | None,
                      reply: str | None) -> None:
        commands: list[tuple[EncodableT, ...]] = []
        if terminal and reply:
            pairs = [x for name, value in {"id": inv_id, **terminal[-1]}.items() for x in (name, value)]
            commands.append(("EVAL", ANSWER_SCRIPT, 1, reply, max(1, int(self.ttl)), *pairs))
        elif terminal:
            commands.append(("EVAL", _APPEND, *self._append_args(inv_id, terminal)))
        commands += [("XACK", key, Keys.GROUP, entry_id), ("XDEL", key, entry_id)]
        # Sent again while Redis is down (the keys' TTL at most: then nobody waits for the answer):
        # an answer written twice is taken once (its id, its index), XACK and XDEL are idempotent.
        # Left pending, a JSON call's entry would be reclaimed and run again. One pipeline fails whole,
        # so what is sent again is all of it, in order.
        until, backoff = time.monotonic() + self.ttl, Backoff(0.05, 0.5)
        while True:
            outcomes = await asyncio.gather(*map(self._send, commands), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, Exception) and not isinstance(outcome, REDIS_DOWN):
                    log.warning("worker %s: finishing invocation %s: %s", self.id, inv_id, outcome)
            down = [c for c, o in zip(commands, outcomes, strict=True) if isinstance(o, REDIS_DOWN)]
            if not down:
                return
            if time.monotonic() + backoff.delay > until:
                log.warning("worker %s: could not finish invocation %s (Redis unreachable for %g s); its "
                            "entry stays pending", self.id, inv_id, self.ttl)
                return
            commands = down
            await backoff.sleep()

    def _send(self, command: tuple[EncodableT, ...]) -> asyncio.Future[Any]:
        """A command through the Batcher; XACK and XDEL merged with the loop turn's others of their
        queue (one XACK, one XDEL for every entry that finished together), after its answers."""
        if command[0] == "XACK":
            return self.batch.merge(command[:3], *command[3:])
        if command[0] == "XDEL":
            return self.batch.merge(command[:2], *command[2:])
        return self.batch.call(*command)

    # -- running -----------------------------------------------------------------------------
    async def _run_entry(self, key: str, entry_id: str, call: Call, reclaimed: bool, cancelled: bool) -> None:
        inv_id = call.id
        terminal: list[dict[str, str]] | None = None
        left = call.deadline - time.time()
        self._deadlines[inv_id] = time.monotonic() + (left if math.isfinite(left) else self.ttl)
        try:
            if not cancelled and inv_id not in self._cancelled and await self._should_run(call, reclaimed):
                terminal = await self._execute(call)
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
            self._deadlines.pop(inv_id, None)
            self.completed += 1
        await self._done_with(inv_id, terminal, call.reply)

    async def _should_run(self, call: Call, reclaimed: bool) -> bool:
        """False when there is nothing to run, only the entry to ack: (reclaimed) already answered,
        or answered here with "worker lost" since its output had begun. (Cancelled while queued:
        the caller checked the marker.)"""
        inv_id = call.id
        if reclaimed:
            last: Any = await through_outage(lambda: self.redis.xrevrange(self.keys.output(inv_id), count=1),
                                             self._until(inv_id))
            kind = entry_kind(last[0][1]) if last else None
            if kind in ("result", "error"):
                return False  # finished, only the ack was lost
            if kind == "data":
                err = WorkerLostError(f"the worker running {call.function!r} was lost after its "
                                      "output began; the invocation was not retried")
                await self._write(inv_id, [error_entry(err)])
                return False
            log.info("worker %s: re-running invocation %s taken over from a lost worker", self.id, inv_id)
        return True

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
        (EVAL, not EVALSHA: in a pipeline a missing script would fail with no retry; Redis caches it.)
        Sent again while Redis is down, until the invocation's deadline: the frontend relays an entry
        written twice once (its index `i`) and ends at the first terminal entry."""
        args = self._append_args(inv_id, entries)
        return bool(await through_outage(lambda: self.batch.call("EVAL", _APPEND, *args), self._until(inv_id)))

    async def _execute(self, call: Call) -> list[dict[str, str]] | None:
        """Run it, writing its stream as it goes; returns its terminal entry, which _done_with writes
        with the queue ack (None: nothing to write, the client is gone)."""
        inv_id, name = call.id, call.function  # its `function_key` (tenant and name)
        first = origin(self.id)   # which worker runs it, and its version: on the first entry written
        try:
            dep = self.registry.by_key(name)
            if time.time() > call.deadline:
                raise FunctionTimeoutError(f"function {name!r} timed out before a worker could take it")
            inv = Invocation(dep, call.event, mode=call.mode, loop=asyncio.get_running_loop(),
                             buffer_events=call.buffer, max_write_size=call.max_write,
                             max_response_size=call.max_response, trace_id=call.trace, keep_items=call.items,
                             buffer_bytes=call.buffer_bytes)
            inv.id = inv_id
            inv.deadline = min(inv.deadline, time.monotonic() + call.deadline - time.time())
            if not await self._start_when_free(inv, inv_id):
                return None
        except FunctionServiceError as exc:
            return [{**error_entry(exc), **first}]
        self._running[inv_id] = inv
        if inv.streaming:
            first = await self._write_output(inv, inv_id, first)
        try:
            terminal = result_entry(await inv.encoded_result())
        except asyncio.CancelledError:
            if inv.cancel_reason is None:
                raise
            task = asyncio.current_task()
            if task is not None and inv.task is task:
                task.uncancel()   # a JSON call ran in this task: the cancel was its, not ours
            return None  # the client is gone: nobody reads the output
        except FunctionServiceError as exc:
            terminal = error_entry(exc)
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
                window.acked(*await through_outage(
                    lambda: self.redis.mget(self.keys.ack(inv_id), self.keys.ack_chars(inv_id)), self._until(inv_id)))
                if window.full():
                    now = time.monotonic()
                    if (window.acked_events, window.acked_chars) != acked:
                        stalled_since = now  # the frontend reads on: slowly
                    elif now - stalled_since > self.ttl:
                        # No ack for as long as the invocation's keys live. A frontend whose client
                        # stalls renews the output stream's TTL while it waits; if the stream expired,
                        # nobody did: its frontend is gone (killed, or cut off from Redis).
                        if not await through_outage(lambda: self.redis.exists(self.keys.output(inv_id)),
                                                    self._until(inv_id)):
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
            values = None
            if inv.keep_items:  # which writes' values are their JSON (RemoteInvocation._relay)
                values = "".join("j" if isinstance(p, Item) and p.value is not p else "s" for p in batch)
            entry = data_entry(first, window.written_events, lengths, batch, values)
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
                if waited % 25 == 0:
                    try:
                        if await self.redis.exists(self.keys.cancelled(inv_id)):
                            return False
                    except REDIS_DOWN:
                        pass   # looked at again 25 waits later
                await asyncio.sleep(0.02)
