"""The work queue, frontend side: enqueue an invocation, relay its output stream as it arrives.

An invocation is one entry on its function's queue stream (`{queue:NAME}`); a worker takes it
with XREADGROUP and writes entries to the invocation's own output stream (`{inv:ID}:out`):
`data` (a batch of stream writes: `d` their payloads end to end, `n` their lengths, comma-separated,
`i` the index of its first write, so a gap is seen),
then one terminal `result` or `error`; the first entry also names the worker (`w`) and its protocol
version (`p`). Every entry is built and read by runtime/cluster/wire.py.
`RemoteInvocation` pumps that stream into a bounded OutputChannel and resolves `task` with the
result, so the HTTP response reads it exactly as it reads a local Invocation.
Flow control: the pump records how many events and characters it has taken (`{inv:ID}:ack`,
`{inv:ID}:ackc`: two keys, so a node of the version before, which knows only the first, still
agrees with this one) and trims what it has read from the output stream (all but the last entry, which
tells a reclaiming worker the output had begun); a worker never runs more than two buffers of
bytes (32 of events; eight for a frontend of the version before) ahead of it, so Redis holds
about that much of a stream a client reads slowly.
Every per-invocation key has a TTL and is deleted by the frontend at the end, many invocations' in one DEL
(the worker's `taken` guard too, but when the enqueue was resent: see WorkQueue.submit).
A plain JSON invocation relays nothing but its answer: when the workers know how, the worker puts
it on the frontend's answers stream instead, which one task reads for all (runtime/cluster/answers.py).
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from runtime.channel import OutputChannel
from runtime.codec import Item
from runtime.deployment import function_key
from runtime.errors import FunctionServiceError
from runtime.invocation_ids import new_invocation_id, new_trace_id
from runtime.manifest import FunctionSpec
from runtime.surface import Mode, resolve_mode
from runtime.tasks import checkpoint, retrieve

from .answers import DEADLINE_GRACE, POLL_MS, AnswerReader, silent_worker_timeout
from .batch import Batcher
from .settings import (
    REDIS_DOWN,
    AnyRedis,
    ClusterUnavailableError,
    Keys,
    OutputLostError,
    WorkerLostError,
    slot_of,
    through_outage,
)
from .wire import Data, Terminal, WireError, decode_output, encode_call

__all__ = ("RemoteInvocation", "WorkQueue")

log = logging.getLogger("fnstream.cluster")

# Seconds a cancel marker outlives its invocation's deadline (other nodes' clocks may be behind).
CANCEL_MARGIN = 5


class WorkQueue:
    """Enqueues invocations for the cluster's workers."""

    def __init__(self, redis: AnyRedis, keys: Keys, node: str, *, ttl: float, heartbeat: float) -> None:
        self.redis, self.keys, self.ttl, self.heartbeat = redis, keys, ttl, heartbeat
        self.key_ttl = max(1, int(ttl))  # whole seconds, as EX and EXPIRE take them
        self._cleanup: set[asyncio.Task[Any]] = set()
        self.batch = Batcher(redis)    # the enqueues of one loop turn in one round trip
        self._doomed: list[str] = []   # keys of finished invocations, deleted together (one DEL per loop turn)
        self.answers = AnswerReader(redis, keys, node, self.batch, ttl=self.key_ttl)

    async def close(self) -> None:
        await self.answers.close()
        await self.batch.close()

    async def submit(self, spec: FunctionSpec, event: Any, *, mode: Mode, buffer_events: int, max_write_size: int,
                     max_response_size: int, trace_id: str | None, timeout: float | None = None,
                     buffer_bytes: int | None = None, keep_items: bool = False,
                     reply: bool = False, accepted: bool = False,
                     invocation_id: str | None = None) -> RemoteInvocation:
        """Queue one invocation; `timeout` shortens the function's own (a job's executionTimeout);
        `buffer_events` / `buffer_bytes` bound its output channel here as a local one's; with
        `keep_items` its generator items reach the channel as `Item`s with their values (a job's
        output), as a local invocation's do; with `reply`, a JSON invocation's answer comes on this
        node's answers stream; with `accepted` (a stored job) the enqueue is retried while
        Redis is down, within the deadline (else it is a 503 at once: a caller waits for it)."""
        seconds = spec.timeout if timeout is None else min(timeout, spec.timeout)
        inv = RemoteInvocation(self, spec, event, mode=mode, buffer_events=buffer_events,
                               max_response_size=max_response_size, trace_id=trace_id, timeout=seconds,
                               buffer_bytes=buffer_bytes, invocation_id=invocation_id)
        key = function_key(spec.tenant, spec.name)  # names are per tenant: so are queues
        answers = self.answers.key if reply and inv.mode == "json" else None
        # (bufferBytes: the worker's own Invocation is bounded alike; items: the worker says which
        # writes carry a JSON value, `v`, _relay)
        entry = encode_call(inv.id, key, json.dumps(event), mode=inv.mode, trace=inv.trace_id,
                            deadline=time.time() + seconds, buffer=buffer_events, max_write=max_write_size,
                            max_response=max_response_size, buffer_bytes=buffer_bytes, items=keep_items,
                            reply=answers)
        if answers is not None:
            inv.answer = self.answers.wait(inv)  # before the entry exists: its answer may come first
        attempts = 0

        def enqueue() -> asyncio.Future[Any]:
            nonlocal attempts
            attempts += 1
            return self.batch.call("XADD", self.keys.queue(key), "*", *entry)
        try:
            # Again while Redis is down, within the deadline: the same entry (the same invocation
            # id), so a repeat that landed twice runs once (the worker's `taken` guard, worker_intake.py),
            # a guard then kept to its TTL (`resent`), not deleted with the invocation's keys.
            await through_outage(enqueue, inv.deadline if accepted else 0.0)
            inv.resent = attempts > 1
        except REDIS_DOWN as exc:
            inv.drop_answer()
            raise ClusterUnavailableError(f"cannot queue {spec.name!r} for the cluster's workers: Redis is "
                                          f"unreachable ({exc}); retry later") from None
        except BaseException:
            inv.drop_answer()
            raise
        if inv.answer is None:
            inv.start()
        return inv

    async def cancel(self, inv_id: str, reason: str, remaining: float = 0.0) -> None:
        """Tell whichever worker runs (or will take) the invocation to stop, then drop its keys.

        The marker lasts as long as the entry may still be taken (`remaining` seconds to its
        deadline, after which a worker skips it anyway): a call that waits in its queue longer than
        the keys' TTL must still find it, or the call whose client left runs after all."""
        ttl = max(self.key_ttl, math.ceil(remaining) + CANCEL_MARGIN)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(self.keys.cancelled(inv_id), reason, ex=ttl)
                pipe.delete(self.keys.output(inv_id), self.keys.ack(inv_id), self.keys.ack_chars(inv_id),
                            self.keys.taken(inv_id))   # (the marker keeps any second entry from running)
                await pipe.execute()
            # After the marker is set; outside the pipeline (a cluster pipeline cannot PUBLISH).
            await self.redis.publish(self.keys.cancel_channel, inv_id)
        except REDIS_DOWN as exc:
            log.warning("could not send the cancellation of %s (Redis unreachable: %s); its keys expire", inv_id, exc)

    def drop(self, *keys: str) -> None:
        """Delete these keys soon: every finished invocation of this loop turn in one DEL."""
        if not self._doomed:
            asyncio.get_running_loop().call_soon(self._flush_doomed)
        self._doomed.extend(keys)

    def _flush_doomed(self) -> None:
        keys, self._doomed = self._doomed, []
        self.background(self._delete(keys))

    async def _delete(self, keys: list[str]) -> None:
        try:
            await self.redis.delete(*keys)
        except REDIS_DOWN:
            pass  # they expire

    def background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)


class RemoteInvocation:
    """An invocation running on some worker, seen through the InvocationSurface (runtime/surface.py):
    `channel` (bounded, `get_batch`), `outcome()` / `encoded_result()` (the worker's answer or its
    FunctionServiceError), `cancel()`. The worker already encoded the answer (generator items folded in).
    Its answer comes from its own pump (`task`), or for a JSON call from the node's AnswerReader (`answer`)."""

    def __init__(self, queue: WorkQueue, spec: FunctionSpec, event: Any, *, mode: Mode, buffer_events: int,
                 max_response_size: int, trace_id: str | None, timeout: float | None = None,
                 buffer_bytes: int | None = None, invocation_id: str | None = None) -> None:
        self.queue = queue
        self.id = invocation_id or new_invocation_id()
        self.trace_id = trace_id or new_trace_id()
        self.spec = spec
        self.event = event
        self.mode: Mode = resolve_mode(mode, spec)
        self.loop = asyncio.get_running_loop()
        self.started = time.monotonic()
        self.deadline = self.started + (spec.timeout if timeout is None else timeout)
        self.buffer_events = buffer_events
        self.max_response_size = max_response_size
        # The local Invocation's bound (runtime/channel.py): events and bytes, one larger write alone.
        self.channel: OutputChannel[str] = OutputChannel(self.loop, buffer_events, buffer_bytes)
        self.task: asyncio.Task[str | None] | None = None
        self.answer: asyncio.Future[str | None] | None = None
        self.worker: str | None = None
        self.events = 0
        self.chars = 0  # characters of the payloads relayed: the worker's byte window
        self.cancel_reason: str | None = None
        self._finished = False
        self._worker_missing_since: float | None = None
        self.resent = False   # its enqueue was sent more than once: it may be queued twice

    @property
    def streaming(self) -> bool:
        return self.mode != "json"

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def start(self) -> None:
        self.task = self.loop.create_task(self._pump(), name=f"remote-invocation-{self.id}")

    async def encoded_result(self) -> str | None:
        """The answer as the worker encoded it, or its error (same contract as Invocation's)."""
        if self.answer is not None:
            return await self.answer
        assert self.task is not None
        return await self.task

    def answered(self, fields: dict[str, str]) -> None:
        """The AnswerReader found its terminal entry: a `result` or an `error` (anything else, or
        an answer of a worker of another protocol version, fails the call: it is not misread)."""
        self._finished = True
        try:
            answer = decode_output(fields)
            if isinstance(answer, Data):
                raise WireError("a data entry where an answer was expected")
        except WireError as exc:
            log.warning("invocation %s of %s: refusing the answer of worker %s: %s", self.id, self.spec.name,
                        fields.get("w"), exc.message)
            answer = Terminal(fields.get("w"), None, exc)
        self.worker = answer.worker or self.worker
        if not self.resent:   # in the pipeline of the reader's XTRIM (this loop turn): no round trip of its own,
            taken = self.queue.keys.taken(self.id)   # one DEL for every answer of the batch (on one slot)
            self.queue.batch.merge(("DEL",), taken, slot=slot_of(self.queue.redis, taken)).add_done_callback(retrieve)
        assert self.answer is not None
        if self.answer.done():
            return
        if answer.error is None:
            self.answer.set_result(answer.text)
        else:
            self.answer.set_exception(answer.error)

    def drop_answer(self, reason: str | None = None) -> None:
        """Nobody awaits the answer any more (cancelled, or never queued): stop waiting for it."""
        if self.answer is not None:
            self.queue.answers.forget(self.id)
            self.answer.cancel(reason)   # (no-op once answered)
            self.answer.add_done_callback(retrieve)

    def give_up(self, error: FunctionServiceError, *, cancel: bool = True) -> None:
        """The AnswerReader stopped waiting for the answer: `error` is the outcome; with `cancel`,
        the worker is told to stop (a timeout), without it not (Redis is unreachable)."""
        assert self.answer is not None
        if not self.answer.done():
            self.answer.set_exception(error)
        if cancel:
            self.cancel(error.message)

    async def outcome(self) -> Any:
        """The result relayed from the worker, or its error (same contract as Invocation.outcome)."""
        text = await self.encoded_result()
        return json.loads(text) if text else None

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is not None:
            return
        self.cancel_reason = reason
        self.channel.cancel(reason)
        self.drop_answer(reason)
        if self.task is not None:
            self.task.add_done_callback(retrieve)
            if not self.task.done():
                self.task.cancel(reason)
        if not self._finished:
            log.info("remote invocation %s of %s cancelled: %s", self.id, self.spec.name, reason)
            self._tell_workers_to_stop(reason)

    def _tell_workers_to_stop(self, reason: str) -> None:
        """Whichever worker runs it, or will take it from the queue before its deadline, stops (or skips it)."""
        self.queue.background(self.queue.cancel(self.id, reason, self.remaining()))

    async def _pump(self) -> str | None:
        keys, redis = self.queue.keys, self.queue.redis
        out = keys.output(self.id)
        last = "0-0"
        try:
            while True:
                if time.monotonic() > self.deadline + DEADLINE_GRACE:
                    error = silent_worker_timeout(self.spec)
                    self.cancel(error.message)
                    raise error
                try:   # a Redis restart is waited out, up to the deadline (what was read is acked)
                    reply: Any = await through_outage(
                        functools.partial(redis.xread, {out: last}, count=self.buffer_events, block=POLL_MS),
                        self.deadline + DEADLINE_GRACE)
                except REDIS_DOWN as exc:
                    raise self._redis_lost(exc) from None
                checkpoint()  # a client gone while the read ran: its cancel must not be lost in redis-py
                if not reply:
                    await self._check_worker()
                    continue
                events = self.events
                for entry_id, fields in reply[0][1]:
                    last = entry_id
                    entry = self._decode(fields)
                    if entry.worker is not None:
                        self.worker = entry.worker
                    if isinstance(entry, Data):
                        await self._relay(entry.lengths, entry.payloads, self._already_relayed(entry.index),
                                          entry.values)
                    else:
                        self._finished = True
                        if entry.error is not None:
                            raise entry.error
                        return entry.text
                if self.events != events:   # flow control: only data moves the worker's window
                    await self._ack(out, last)
        finally:
            self.channel.close()
            if self._finished:   # (the worker's `taken` guard too, unless a second entry may be queued)
                self.queue.drop(keys.output(self.id), keys.ack(self.id), keys.ack_chars(self.id),
                                *(() if self.resent else (keys.taken(self.id),)))

    def _decode(self, fields: dict[str, str]) -> Data | Terminal:
        """An entry of the output stream; one this node does not read (malformed, or of a worker of
        another protocol version) ends the invocation with that error, and the worker is told to stop."""
        try:
            return decode_output(fields)
        except WireError as exc:
            log.warning("invocation %s of %s: refusing the output of worker %s: %s", self.id, self.spec.name,
                        fields.get("w", self.worker), exc.message)
            self._finished = True
            self._tell_workers_to_stop("refused its output")
            raise

    async def _relay(self, lengths: list[int], payloads: str, skip: int = 0, values: str | None = None) -> None:
        """Put a data entry's payloads (`payloads` end to end, `lengths` in characters) in the channel,
        but the first `skip` (already relayed: the entry was written twice). `values` (a `keep_items`
        call's): per payload, `j` if the item the handler yielded was the JSON value of its text, `s`
        if it was the text itself; the channel then gets `Item`s carrying those values."""
        channel, at = self.channel, 0
        for index, n in enumerate(lengths):
            text = payloads[at:at + n]
            at += n
            if skip:
                skip -= 1
                continue
            item = text if values is None else Item.decoded(text, values[index:index + 1] == "j")
            if not channel.try_put(item):
                await self._put_renewing(item)
            self.events += 1
            self.chars += n

    def _already_relayed(self, first: int | None) -> int:
        """How many of a data entry's writes were relayed already. An entry names its first write's
        index (`i`; a worker of the version before does not): output that went missing in Redis
        (expired, evicted, a failover) fails the invocation instead of ending it as if complete;
        an entry written twice (a pipeline resent after a dropped connection) is relayed once."""
        if first is None:
            return 0
        if first > self.events:
            self._finished = True
            self._tell_workers_to_stop("output lost")
            raise OutputLostError(f"events {self.events + 1} to {first} of {self.spec.name!r} were lost on their "
                                  f"way through Redis (expired or evicted); the invocation was not retried")
        return self.events - first

    async def _put_renewing(self, item: str) -> None:
        """Wait for room in the channel (the client reads slowly), renewing the output stream's TTL
        meanwhile: its unread entries must not expire under a client stalled past outputTtlSeconds."""
        ttl = self.queue.key_ttl
        while True:
            try:
                await asyncio.wait_for(self.channel.put(item), timeout=ttl / 3)
                return
            except TimeoutError:
                try:
                    await self.queue.redis.expire(self.queue.keys.output(self.id), ttl)
                except REDIS_DOWN as exc:   # renewed at the next turn: a third of the TTL is left
                    log.info("could not renew the output TTL of %s: %s", self.id, exc)

    async def _ack(self, out: str, last: str) -> None:
        """Move the worker's window and drop what was relayed, up to (not including) `last`."""
        keys, ttl = self.queue.keys, self.queue.key_ttl

        async def send() -> None:   # idempotent: sent again while Redis is down
            async with self.queue.redis.pipeline(transaction=False) as pipe:
                pipe.set(keys.ack_chars(self.id), self.chars, ex=ttl)  # first: an ack without it is an old node's
                pipe.set(keys.ack(self.id), self.events, ex=ttl)
                pipe.xtrim(out, minid=last, approximate=False)
                await pipe.execute()
        try:
            await through_outage(send, self.deadline + DEADLINE_GRACE)
        except REDIS_DOWN as exc:
            raise self._redis_lost(exc) from None

    def _redis_lost(self, exc: BaseException) -> ClusterUnavailableError:
        return ClusterUnavailableError(f"lost the connection to Redis while relaying {self.spec.name!r} "
                                       f"from worker {self.worker}: {exc}")

    async def _check_worker(self) -> None:
        """A worker that vanished after output began is lost; before that, its entry is reclaimed.
        Vanished: its heartbeat key absent for as long as one lives (three heartbeats). A Redis
        restart of a few seconds expires every worker's key at once, and each sets it again within
        a heartbeat of Redis coming back: one look at that moment is not a death."""
        if self.worker is None or self.events == 0:
            return
        try:
            alive = await self.queue.redis.exists(self.queue.keys.worker(self.worker))
        except REDIS_DOWN:
            return   # unknown: the next poll looks again
        now = time.monotonic()
        if alive:
            self._worker_missing_since = None
            return
        if self._worker_missing_since is None:
            self._worker_missing_since = now
        if now - self._worker_missing_since >= 3 * self.queue.heartbeat:
            self._finished = True
            self._tell_workers_to_stop("worker lost")
            raise WorkerLostError(f"worker {self.worker} running {self.spec.name!r} was lost after "
                                  f"{self.events} events; the invocation was not retried")
