"""Durable invocation output: a streaming invocation's events outlive the connection that asked.

Each SSE invocation's events are published, as the answer reads them, to the named stream
`invocations/<id>` of the function's tenant (runtime/streams: its retention, its `from_id` replay),
so the same output can be read again by the invocation's id (frontend/routes/invocations.py) or
as a named stream (the subscribe REST routes): the same events with the same ids (the broker's
ids 1, 2, ... are the answer's `id:`s), then the result or error event, then an element `[DONE]`.

Kept while it runs (bounded by `streams.invocationRetentionBytes`) and for
`streams.invocationRetentionSeconds` after it ends; at most `invocationRetentionCount` ended ones
(so retention never fills `streams.maxStreams`). Past that count the oldest record of the tenant
keeping the most goes first: one tenant's flood of invocations cannot evict another's output.
Only SSE invocations are kept: a plain JSON call costs nothing here (not a task, not a record),
and neither does a streaming one until it writes (its named stream is made by the first publish).

With the manifest's `onDisconnect: continue`, an answer whose client left is not cancelled: a pump
task takes over reading its output into the stream (the handler never notices), until the end.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from .errors import FunctionServiceError
from .principal import Principal, may_manage
from .streams import AbstractBroker, StreamOptions
from .streams.broker import AbstractSubscription
from .streams.tenancy import qualify
from .surface import InvocationSurface
from .tasks import retrieve

__all__ = ("DurableOutputs", "Retained", "STREAM_PREFIX", "DONE", "InvocationNotFoundError", "InvocationOverError",
           "InvocationCancelledError", "ClientGoneError", "error_text")

log = logging.getLogger("fnstream.runtime")
T = TypeVar("T")

STREAM_PREFIX = "invocations/"  # the named stream of invocation X is `invocations/X` in its tenant's namespace
DONE = "[DONE]"
_REAP_DELAY = 0.1  # seconds: forgotten streams are deleted in batches (at 10k ends/s, ~1000 wait)


class InvocationNotFoundError(FunctionServiceError, LookupError):
    """Unknown, expired, or another tenant's (the same answer for all three: ids are not probed)."""

    code, status = 200404, 404


class InvocationOverError(FunctionServiceError):
    code, status = 200409, 409


class InvocationCancelledError(FunctionServiceError):
    """How a stream cancelled by id ends (its last event before [DONE])."""

    code, status = 200410, 410


class ClientGoneError(FunctionServiceError):
    """How the kept output of an invocation cancelled by its client's drop ends (onDisconnect: cancel)."""

    code, status = 200499, 499


def error_text(exc: FunctionServiceError) -> str:
    """An error event's data, as the invoke route writes it."""
    return json.dumps(exc.to_dict(), ensure_ascii=False, separators=(",", ":"))


class Retained:
    """One kept invocation: where its output goes, and how far it got."""

    __slots__ = ("broken", "cancelled", "configured", "continues", "done_id", "ending", "flusher", "id", "inv", "key",
                 "next_id", "outputs", "over", "plain", "queue", "remote", "timer")

    def __init__(self, inv: InvocationSurface | None, tenant: str, continues: bool, inv_id: str = "",
                 plain: Callable[[FunctionServiceError], str] | None = None) -> None:
        self.id = inv.id if inv is not None else inv_id
        self.key = qualify(tenant, STREAM_PREFIX + self.id)
        self.inv: InvocationSurface | None = inv  # dropped once it is over (nothing else holds it)
        self.continues = continues     # onDisconnect: continue
        self.next_id = 1               # the id the next published event gets
        self.done_id: int | None = None  # the id of the `[DONE]` element, once known
        self.over = False              # the result (or error) and [DONE] were published
        self.broken: str | None = None  # why the kept output is incomplete (a refused publish)
        self.configured = False
        self.ending: asyncio.Future[str | None] | None = None  # the encoded result being awaited (continue)
        self.timer: asyncio.TimerHandle | None = None
        self.outputs: DurableOutputs | None = None
        self.remote = False  # a view of one another frontend keeps (cluster mode): see find_shared
        self.cancelled: FunctionServiceError | None = None  # a cancel by id of an invocation with no abort()
        self.queue: list[str] | None = None  # cluster mode: events not yet published (DurableOutputs._flush)
        self.flusher: asyncio.Task[None] | None = None
        # An answer framed as OpenAI's streams are (frontend/routes/openai.py): events without
        # `id:` lines, no result event, its errors in the shape `plain` writes. None: the invoke SSE.
        self.plain = plain

    def error_event(self, exc: FunctionServiceError) -> str:
        """The data of the error event the answer ends with."""
        return error_text(exc) if self.plain is None else self.plain(exc)

    async def put(self, batch: list[str]) -> None:
        assert self.outputs is not None
        await self.outputs.publish(self, batch)

    @property
    def tenant(self) -> str:
        return self.key.partition("/")[0]


class DurableOutputs:
    """The node's kept invocations, by id."""

    def __init__(self, broker: AbstractBroker, *, seconds: float, max_bytes: int, count: int,
                 shared: bool = False, send_cancel: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.broker = broker
        self.shared = shared   # whether other frontends publish to the same broker (cluster mode)
        # Cluster mode: tell every frontend to cancel an id (runtime/cluster/invocation_cancels.py).
        self.send_cancel = send_cancel
        self.seconds = seconds
        self.max_bytes = max_bytes
        self.count = count
        self.enabled = seconds > 0 and count > 0
        self._running: dict[str, Retained] = {}
        self._ended: dict[str, Retained] = {}
        # The ended records of each tenant, oldest end first: what goes when there are too many.
        self._ended_by_tenant: dict[str, OrderedDict[str, Retained]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._warned = -math.inf
        self._doomed: list[str] = []  # streams of forgotten records, deleted by `_reap`
        self._reaper: asyncio.TimerHandle | None = None  # armed while streams wait to be deleted
        # Bytes bound it, not a count (each event is a byte at least): the Redis broker would
        # otherwise keep only streams.subscriberBuffer events of a long answer.
        self._options = StreamOptions(retain_num=max_bytes, retain_bytes=max_bytes, policy="cut",
                                      max_stream_size=max_bytes)
        # An OpenAI stream agrees on its `[DONE]` as the terminator (REST subscribers end there):
        # what tells another frontend (find_shared) to replay it in that framing.
        self._plain_options = dataclasses.replace(self._options, terminator=DONE)

    def __len__(self) -> int:
        return len(self._running) + len(self._ended)

    # -- the answer's side ---------------------------------------------------------------------
    def open(self, inv: InvocationSurface,
             plain: Callable[[FunctionServiceError], str] | None = None) -> Retained | None:
        """Keep `inv`'s output (an SSE invocation); None when it is not kept. `plain`: the answer
        is framed as OpenAI's (see Retained.plain) and this writes its error events."""
        if not self.enabled or inv.mode != "sse":
            return None
        spec = inv.spec
        rec = Retained(inv, spec.tenant, getattr(spec, "onDisconnect", "cancel") == "continue", plain=plain)
        self._running[rec.id] = rec
        return rec

    def tee(self, rec: Retained) -> Callable[[list[str]], Awaitable[None]]:
        """What the answer's relay calls with each batch before it writes it to the socket (a
        bound method of the record: no closure per open stream)."""
        rec.outputs = self
        return rec.put

    async def publish(self, rec: Retained, payloads: Sequence[str]) -> None:
        """Append events; a refusal (a full broker, an empty write) marks the kept output broken,
        never the live answer."""
        rec.next_id += len(payloads)
        if rec.broken is not None:
            return
        if self.shared:  # Redis: a publish is ~1 ms; off the answer's path, in order (see _flush)
            if rec.queue is None:
                rec.queue = []
            rec.queue.extend(payloads)
            if rec.flusher is None:
                rec.flusher = self._spawn(self._flush(rec))
            return
        await self._put(rec, payloads)

    async def _flush(self, rec: Retained) -> None:
        """Publish what the answer queued, everything pending at once, until nothing is left
        (one task per record only while it has something to send)."""
        try:
            while rec.queue:
                payloads, rec.queue = rec.queue, []
                await self._put(rec, payloads)
        finally:
            rec.flusher = None

    async def flushed(self, rec: Retained) -> None:
        """Wait until everything queued for `rec` is published (a reader is about to subscribe)."""
        while rec.flusher is not None:
            await asyncio.wait([rec.flusher])

    async def _put(self, rec: Retained, payloads: Sequence[str]) -> None:
        if rec.broken is not None:
            return
        try:
            broker = self.broker
            if not rec.configured:
                rec.configured = True
                await broker.configure(rec.key, self._options if rec.plain is None else self._plain_options)
            await broker.publish(rec.key, [p.encode("utf-8", "surrogatepass") for p in payloads])
        except FunctionServiceError as exc:
            rec.broken = exc.message
            now = time.monotonic()
            if now - self._warned >= 10:  # (a full broker would refuse every one: a line per 10 s, not per call)
                self._warned = now
                log.warning("invocation %s: its output is not kept: %s", rec.id, exc.message)

    async def result(self, rec: Retained | None, inv: InvocationSurface) -> str | None:
        """`inv.encoded_result()`; with onDisconnect: continue, awaited so that the answer's task
        being cancelled (its client left) does not cancel the invocation (the pump awaits it then)."""
        if rec is None:
            return await inv.encoded_result()
        try:
            if not rec.continues:
                return await inv.encoded_result()
            if rec.ending is None:
                rec.ending = asyncio.ensure_future(inv.encoded_result())
                rec.ending.add_done_callback(retrieve)
            return await asyncio.shield(rec.ending)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if rec.cancelled is None or (task is not None and task.cancelling()):
                raise
            raise rec.cancelled from None  # a cluster invocation cancelled by id: its error, as abort() gives

    async def finish(self, rec: Retained, last: str | None) -> None:
        """The last event (result or error; None: none), then [DONE]; kept for `seconds` more."""
        if rec.over:  # (set before the publish: a second finisher, e.g. a drop's, adds nothing)
            return
        rec.over = True
        rec.inv = None
        rec.done_id = rec.next_id + (last is not None)
        await self.publish(rec, [DONE] if last is None else [last, DONE])
        if self._running.pop(rec.id, None) is None:
            return
        self._ended[rec.id] = rec
        self._ended_by_tenant.setdefault(rec.tenant, OrderedDict())[rec.id] = rec
        rec.timer = asyncio.get_running_loop().call_later(self.seconds, self._expire, rec.id)
        while len(self._ended) > self.count:
            largest = max(self._ended_by_tenant.values(), key=len)  # (tenants are few: a scan is cheap)
            self._expire(next(iter(largest)))

    def _expire(self, inv_id: str) -> None:
        """Forget the record now; its stream goes with the next reaping, `_REAP_DELAY` later: one
        task for every stream doomed meanwhile, not one per invocation."""
        rec = self._ended.pop(inv_id, None)
        if rec is None:
            return
        of_tenant = self._ended_by_tenant[rec.tenant]
        del of_tenant[inv_id]
        if not of_tenant:
            del self._ended_by_tenant[rec.tenant]
        if rec.timer is not None:
            rec.timer.cancel()
        if rec.configured:
            self._doomed.append(rec.key)
            if self._reaper is None:
                self._reaper = asyncio.get_running_loop().call_later(_REAP_DELAY, self._spawn_reap)

    def _spawn_reap(self) -> None:
        self._spawn(self._reap())

    async def _reap(self) -> None:
        try:
            while self._doomed:
                keys, self._doomed = self._doomed, []
                for key in keys:
                    try:
                        await self.broker.delete(key)
                    except FunctionServiceError:
                        pass  # already gone (deleted by its tenant, or the broker's own limits)
        finally:
            self._reaper = None

    def client_left(self, inv: InvocationSurface, reason: str) -> None:
        """The answer's client left: cancel `inv`, or (onDisconnect: continue) pump its output on."""
        rec = self._running.get(inv.id)
        if rec is None or not rec.continues or rec.broken is not None:
            inv.cancel(reason)
            if rec is not None:
                self._spawn(self.finish(rec, rec.error_event(ClientGoneError(
                    f"the invocation was cancelled: {reason} (onDisconnect: cancel)"))))
            return
        log.info("client of invocation %s of %s left; it continues (onDisconnect: continue)", inv.id, inv.spec.name)
        self._spawn(self._pump(rec, inv))

    async def _pump(self, rec: Retained, inv: InvocationSurface) -> None:
        """The rest of a detached invocation's output, into its stream, as the answer would have."""
        try:
            if rec.ending is None:  # the answer was still relaying: take over its channel
                channel = inv.channel
                while batch := await channel.get_batch():
                    await self.publish(rec, batch)
            try:
                last = await self.result(rec, inv)
                if rec.plain is not None:
                    last = None  # (an OpenAI stream ends with no result event)
            except FunctionServiceError as exc:
                last = rec.error_event(exc)
            await self.finish(rec, last)
        except asyncio.CancelledError:  # shutdown
            inv.cancel("the server is shutting down")
            raise

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(retrieve)
        return task

    # -- readers -------------------------------------------------------------------------------
    def find(self, principal: Principal | None, inv_id: str) -> Retained:
        """The kept invocation `inv_id`, if `principal` may see it (its tenant, or admin); else 404."""
        rec = self._running.get(inv_id) or self._ended.get(inv_id)
        if rec is None or not may_manage(principal, rec.tenant):
            # The id is not echoed: the answer is the same byte for byte whoever asks for whichever id.
            raise InvocationNotFoundError("no such invocation is kept here (unknown, ended more than "
                                          "streams.invocationRetentionSeconds ago, or not a streaming one)")
        return rec

    async def find_shared(self, tenant: str, inv_id: str) -> Retained:
        """Cluster mode: an invocation another frontend answered, found by its stream in the shared
        broker under `tenant` (the reader's own: another tenant's cannot be named). Its end is the
        `[DONE]` element (`done_id` unknown here: None, and `remote`). 404 when there is none."""
        view = Retained(None, tenant, False, inv_id)
        try:
            stats = await self.broker.stats(view.key)
        except FunctionServiceError:  # StreamNotFoundError, or a name no invocation has
            raise InvocationNotFoundError("no such invocation is kept here (unknown, ended more than "
                                          "streams.invocationRetentionSeconds ago, or not a streaming one)") from None
        view.next_id = stats.last_id + 1
        if stats.terminator == DONE:  # an OpenAI stream's (a view only reads: any error writer marks it)
            view.plain = error_text
        view.configured = True
        view.over = True  # cancel is for the node that answers it
        view.remote = True
        return view

    async def subscribe(self, rec: Retained, from_id: int) -> AbstractSubscription:
        """Its stream from after `from_id` (made here if it has had no event yet)."""
        broker = self.broker
        if not rec.configured:
            rec.configured = True
            await broker.configure(rec.key, self._options if rec.plain is None else self._plain_options)
        return await broker.subscribe(rec.key, from_id=from_id)

    def cancel(self, principal: Principal | None, inv_id: str) -> Retained:
        """Cancel a running kept invocation (404 unknown, 409 over): its answer ends with the cancel
        error, then [DONE]."""
        rec = self.find(principal, inv_id)
        inv = rec.inv
        if rec.over or inv is None:
            raise InvocationOverError(f"invocation {inv_id!r} is already over")
        error = InvocationCancelledError(f"invocation {inv_id} was cancelled by request")
        abort = getattr(inv, "abort", None)
        if abort is not None:
            abort(error)
        else:  # a cluster invocation: its outcome is then this error (see `result`)
            rec.cancelled = error
            inv.cancel(error.message)
        return rec

    def cancel_here(self, inv_id: str) -> None:
        """A cancel another frontend was asked for (cluster mode; the tenant was checked there):
        this frontend's invocation, if it answers it and it still runs."""
        rec = self._running.get(inv_id)
        if rec is not None and not rec.over:
            self.cancel(None, inv_id)

    async def cancel_shared(self, tenant: str, inv_id: str) -> None:
        """Cluster mode: cancel an invocation another frontend answers (404 unless `tenant` has its
        kept stream; 409 once that ends with [DONE])."""
        view = await self.find_shared(tenant, inv_id)
        if self.send_cancel is None:
            raise InvocationNotFoundError("no such invocation is kept here")
        last = view.next_id - 1
        if last >= 1:
            sub = await self.broker.subscribe(view.key, from_id=last - 1)
            try:
                batch = await sub.next_batch(timeout=1.0)
            finally:
                await sub.close()
            if batch and batch[-1].data == DONE.encode():
                raise InvocationOverError(f"invocation {inv_id!r} is already over")
        await self.send_cancel(inv_id)

    async def close(self) -> None:
        """Shutdown: stop the pumps (their invocations are aborted) and forget the rest."""
        if self._tasks:  # queued publishes and detached invocations (aborted by the drain) end by themselves
            await asyncio.wait(list(self._tasks), timeout=1.0)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        if self._reaper is not None:
            self._reaper.cancel()
        await self._reap()
        for rec in self._ended.values():
            if rec.timer is not None:
                rec.timer.cancel()
        self._ended.clear()
        self._ended_by_tenant.clear()
        self._running.clear()

