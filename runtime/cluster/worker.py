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
from typing import cast

from redis.typing import StreamIdT

from ..tasks import checkpoint, stop_tasks
from .settings import REDIS_DOWN, Backoff, Keys
from .wire import WireError, decode_cancel, encode_heartbeat
from .worker_intake import Intake
from .worker_run import log

__all__ = ("QueueConsumer",)


class QueueConsumer(Intake):
    """Runs queued invocations of the functions in `registry` on `executor` (not a worker process:
    those are runtime/process; this is a cluster node's consumer of the work queue): its intake
    (runtime/cluster/worker_intake.py), the running (worker_run.py), and here its life and liveness."""

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
        await self.batch.close()

    def _cancel_running(self) -> None:
        for inv in list(self._running.values()):
            inv.cancel("worker shutting down")

    # -- liveness and cancellation -----------------------------------------------------------
    async def _announce(self) -> None:
        """Refresh this worker's key: alive, and which functions it takes (none while shutting down)."""
        functions = [d.key for d in self.registry.list()] if self.taking else []
        info = encode_heartbeat(len(self._running), self.completed, functions)
        await self.redis.set(self.keys.worker(self.id), info, px=int(self.heartbeat * 3000))

    async def _beat(self) -> None:
        # Backoff capped at a heartbeat: after a Redis outage (which expired this worker's key) it says
        # it is alive within a heartbeat, before frontends and reclaimers take it for dead.
        backoff = Backoff(min(0.1, self.heartbeat), self.heartbeat)
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
                self._outage()
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
                    try:
                        inv_id = decode_cancel(msg["data"])
                    except WireError as exc:
                        log.warning("worker %s: refusing a message on %s: %s", self.id, self.keys.cancel_channel,
                                    exc.message)
                        continue
                    inv = self._running.get(inv_id)
                    if inv is None and inv_id in self._held:
                        self._cancelled.add(inv_id)   # taken, not running yet: _execute checks this
                    elif inv is not None:
                        reason = cast("str | None", await self.redis.get(self.keys.cancelled(inv_id))) or "cancelled"
                        inv.cancel(reason)
            except REDIS_DOWN:
                await backoff.sleep()
            finally:
                await pubsub.aclose()
