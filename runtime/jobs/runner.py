"""Runs jobs: a queue per function, started through the ordinary invocation path as slots free up.

A job is a streaming invocation started by `Dispatcher.dispatch` like any request (here, or
queued for a cluster worker: the dispatcher decides); its channel batches become the job's
numbered output items. Queued jobs wait for the function's `concurrency` (a free slot) instead
of getting 429; `jobs.maxQueued` bounds the waiting.
Every change is written through to the store and awaited (runtime/jobs/writes.py): a submit is
answered once stored (507 when the store refuses it, and the handler never starts), a job is
marked running in the store before its handler starts, each output batch is stored before
readers see it, and a final status is visible only once stored. A refused output or final write
fails the job loudly. After a restart the rules of runtime/jobs/recovery.py apply.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from ..config import JobsConfig
from ..deployment import DEFAULT_TENANT, Deployment, FunctionRef, function_key
from ..dispatch import InvokeOptions
from ..errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError, ServiceUnavailableError
from ..invocation_ids import new_invocation_id
from ..principal import Principal
from ..runpod_compat import set_progress_sink
from ..tasks import stop_tasks
from .cache import JobCache
from .collect import cancelled, collect
from .errors import JobQueueFullError, JobStateError, JobStoreError
from .limits import JobBytes, input_size
from .model import FINAL, Job, JobRequest, Status, new_job_id
from .reads import JobReads
from .recovery import recover, take_over
from .retry import retry
from .store import JobStore, SharedStore
from .writes import StoreWrites

if TYPE_CHECKING:
    from ..dispatch import Dispatcher
    from ..surface import InvocationSurface

__all__ = ("JobManager",)

log = logging.getLogger("fnstream.jobs")
QUEUED_ONLY = "queued:"  # a purge's cancel request: only if the job is still queued then (older nodes ignore it)
_TAKEN_OVER = "another node took the job over"  # the cancel reason of a job taken from this node

SLOT_POLL = 0.02      # seconds between looks for a free slot while a function is at its concurrency
SWEEP_EVERY = 60.0    # seconds between expiry sweeps (at most)
FLUSH_EVERY = 1.0     # seconds between attempts to store final states the store refused


class JobManager(JobReads):
    """Every job of this server: submit, look up, follow, cancel, retry, purge, expire.

    `on_final`: the hooks told of each job's end once it is stored (webhooks, metrics), in order;
    given at construction (runtime/node.py), never added later.
    """

    def __init__(self, config: JobsConfig, dispatcher: Dispatcher, store: JobStore, *,
                 on_final: Iterable[Callable[[Job], None]] = ()) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.store = store
        self.writes = StoreWrites(store)
        self.cache = JobCache(config.cacheBytes) if store.readable else None
        self.jobs: dict[str, Job] = {}
        self._queues: dict[str, collections.deque[str]] = {}
        self._dispatchers: dict[str, asyncio.Task[None]] = {}
        self._running: dict[str, InvocationSurface] = {}  # here, or relayed from a cluster worker
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed: dict[str, asyncio.Event] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[Any] | None = None
        self.on_final: tuple[Callable[[Job], None], ...] = tuple(on_final)
        self.queued = 0
        self.queued_by_tenant: collections.Counter[str] = collections.Counter()  # jobs.maxQueuedPerTenant
        self.stopping = False
        self.bytes = JobBytes(config)  # each tenant's stored bytes (jobs.tenantQuotaBytes)
        # A shared store (Redis, cluster mode): jobs of other nodes are read from it.
        self.shared: SharedStore | None = store if isinstance(store, SharedStore) else None
        if self.shared is not None:
            self.shared.on_cancel = self._cancel_requested
            self.shared.on_refused = self._taken_from_us

    # -- life --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the stored jobs and apply the restart rules, then run what is queued."""
        await recover(self)
        loop = asyncio.get_running_loop()
        self._loop = loop
        set_progress_sink(self._progress_sink)
        self._sweeper = loop.create_task(self._sweep(), name="jobs-sweeper")
        if self.shared is not None:
            self._tasks.add(loop.create_task(take_over(self, self.shared), name="jobs-takeover"))

    def _progress_sink(self, job_id: str, progress: Any) -> bool:
        """runpod.serverless.progress_update() from a handler (any thread): shown while the job runs."""
        job = self.jobs.get(job_id)
        if job is None or job.id not in self._running:
            return False
        self._loop.call_soon_threadsafe(self._progressed, job, progress)
        return True

    def _progressed(self, job: Job, progress: Any) -> None:
        if job.status == "IN_PROGRESS":
            job.progress = progress
            self._notify(job)

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]:
        """Run `coro` as a task of the manager (stopped with it); it handles its own store errors,
        and anything else it raises is logged, never left unretrieved."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("jobs: %s failed: %r", task.get_name(), exc, exc_info=exc)

    async def stop_taking(self) -> None:
        """Start no more jobs (Lifecycle.stop_intake: before the drain aborts the running ones, which
        then stay IN_PROGRESS in the store and the restart rules apply)."""
        self.stopping = True

    async def stop(self) -> None:
        """Stop dispatching; running jobs stay IN_PROGRESS in the store (the restart rules apply)."""
        self.stopping = True
        set_progress_sink(self._progress_sink, remove=True)
        tasks = [*self._dispatchers.values(), *self._tasks]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
        await stop_tasks(tasks, "jobs")
        if await self.writes.flush():
            for job_id in self.writes.unsaved:
                log.error("jobs: the final state of job %s could not be stored; the restart rules will apply to it",
                          job_id)
        await self.store.close()

    # -- submit ------------------------------------------------------------------------------
    async def submit(self, function: FunctionRef, event: Any, request: JobRequest) -> Job:
        """Queue a job of `function` (Dispatcher.submit_job checked the tenant); returns once it is
        stored (429 beyond jobs.maxQueued)."""
        if self.stopping:
            raise ServiceUnavailableError("the server is shutting down")
        self._check_queue_room(function.spec.tenant)
        size = input_size(event)
        self.bytes.check(function.spec.tenant, size, sync=request.sync)  # 413, 507
        spec = function.spec
        limit = spec.timeout if request.execution_timeout is None else min(request.execution_timeout, spec.timeout)
        job_id = new_job_id() if request.key is None else request.key.job_id  # a key's claim names its job's id
        job = Job(id=job_id, function=spec.name, tenant=spec.tenant, event=event, api=request.api,
                  webhook=request.webhook, execution_timeout=limit, ttl=request.ttl, raw=spec.rawStream,
                  invocation_id=new_invocation_id())
        if request.api == "runpod" and isinstance(event, dict):
            event["id"] = job.id  # the handler's event is RunPod's job: {"id", "input"}
        self.bytes.add_input(job, size)
        self._count_queued(job, 1)  # holds its place in jobs.maxQueued while it is stored
        try:
            # stored before anything can start it (507 if refused), with its Idempotency-Key if it has one
            await self.writes.save(job, retry=False, bind=request.key)
        except BaseException:
            self._count_queued(job, -1)
            self.bytes.forget(job.id)
            raise
        self.jobs[job.id] = job
        self._enqueue(job, counted=True)
        return job

    def _check_queue_room(self, tenant: str) -> None:
        """429 when the node (jobs.maxQueued) or the tenant (jobs.maxQueuedPerTenant) has no room:
        one tenant's backlog never refuses another tenant's jobs before the node is full."""
        if self.queued_by_tenant[tenant] >= self.config.maxQueuedPerTenant:
            raise JobQueueFullError(f"{self.queued_by_tenant[tenant]} jobs of tenant {tenant!r} are queued "
                                    "(jobs.maxQueuedPerTenant); retry later")
        if self.queued >= self.config.maxQueued:
            raise JobQueueFullError(f"{self.queued} jobs are queued (jobs.maxQueued); retry later")

    def _count_queued(self, job: Job, delta: int) -> None:
        self.queued += delta
        self.queued_by_tenant[job.tenant] += delta
        if self.queued_by_tenant[job.tenant] <= 0:
            del self.queued_by_tenant[job.tenant]

    def _drop_queued(self, job: Job) -> None:
        self.jobs.pop(job.id, None)
        self.bytes.forget(job.id)
        queue = self._queues.get(job.key)
        if queue is not None and job.id in queue:
            queue.remove(job.id)
            self._count_queued(job, -1)

    def _enqueue(self, job: Job, *, counted: bool = False) -> None:
        self._queues.setdefault(job.key, collections.deque()).append(job.id)
        if not counted:
            self._count_queued(job, 1)
        task = self._dispatchers.get(job.key)
        if task is None or task.done():
            self._dispatchers[job.key] = asyncio.get_running_loop().create_task(
                self._dispatch(job.key), name=f"jobs-dispatch-{job.key}")

    # -- change ------------------------------------------------------------------------------
    async def cancel(self, job: Job) -> Job:
        """Cancel a queued or running job (of any node in cluster mode); 409 once it is finished."""
        if job.final:
            raise JobStateError(f"job {job.id!r} is already {job.status}; only a queued or running job can "
                                "be cancelled")
        if job.remote:
            assert self.shared is not None
            await self.shared.request_cancel(job.id)
            return job
        return await self._cancel_local(job)

    def _cancel_requested(self, job_id: str) -> None:
        """Another node asked to cancel a job (shared store): cancel it if it is ours and still going
        (a purge's, named `QUEUED_ONLY` + id: if it is still queued)."""
        queued_only = job_id.startswith(QUEUED_ONLY)
        job = self.jobs.get(job_id.removeprefix(QUEUED_ONLY))
        if job is not None and not job.final and (not queued_only or job.status == "IN_QUEUE"):
            self.spawn(self._cancel_local(job), f"jobs-cancel-{job_id}")

    def _taken_from_us(self, job_id: str) -> None:
        """Another node took this job (this one stalled past its lease, or a retry through another node
        took a job that ended here; shared store): stop running it here, so its handler does not go
        on beside the taker's, and forget it; the taker's state is
        read from the store from now on. Nothing of it is finished or announced (webhook) here."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        self._drop_queued(job)
        self.writes.forget(job_id)
        if self.cache is not None:
            self.cache.forget(job_id)
        job.remote = True  # who follows or waits on it here reads the store from now on
        self._notify(job)
        inv = self._running.get(job_id)
        if inv is not None:
            inv.cancel(_TAKEN_OVER)

    def _ours(self, job: Job) -> bool:
        """Still this node's job: `_taken_from_us` forgets a job another node took."""
        return self.jobs.get(job.id) is job

    async def _cancel_local(self, job: Job) -> Job:
        inv = self._running.get(job.id)
        if inv is None and (job.status == "IN_PROGRESS" or job.changing):  # being started, or its end stored
            job.cancel_requested = True
            return job
        if inv is None:
            await self._finish(job, "CANCELLED", error=cancelled())
        else:
            job.cancel_requested = True
            inv.cancel("the job was cancelled")
        return job

    async def retry(self, job: Job) -> Job:
        """Run a FAILED or TIMED_OUT job (of any node in cluster mode) again: runtime/jobs/retry.py."""
        return await retry(self, job)

    async def purge(self, function: str, tenant: str = DEFAULT_TENANT) -> int:
        """Cancel the tenant's queued jobs of `function` (in cluster mode other nodes' too); how many."""
        queue = self._queues.get(function_key(tenant, function), ())  # names are per tenant
        queued = [self.jobs[i] for i in queue if self.jobs[i].status == "IN_QUEUE"]
        for job in queued:
            await self._finish(job, "CANCELLED", error=cancelled("the queue was purged"))
        removed = len(queued)
        if self.shared is not None:
            for job in await self.shared.recent(function=function):
                if (job.status == "IN_QUEUE" and job.id not in self.jobs and job.function == function
                        and job.tenant == tenant):
                    await self.shared.request_cancel(QUEUED_ONLY + job.id)
                    removed += 1
        return removed

    async def advance_stream(self, job: Job) -> list[Any]:
        """RunPod's /stream: the items not returned by /stream before (the cursor is kept; in
        cluster mode in the shared store, so each item is returned once whichever node is asked)."""
        if self.shared is not None:
            return await self.shared.advance_cursor(job.id)
        items = job.outputs[job.stream_cursor:]
        if items:
            job.stream_cursor = len(job.outputs)
            try:
                await self.writes.save(job)
            except JobStoreError as exc:  # the items are answered; after a restart /stream returns them again
                log.warning("jobs: the /stream cursor of job %s could not be stored: %s", job.id, exc.message)
        return items

    # -- run ---------------------------------------------------------------------------------
    async def _dispatch(self, function: str) -> None:
        """Start the function's (`function_key`) queued jobs in order, each when a slot is free."""
        queue = self._queues[function]
        while queue and not self.stopping:
            job = self.jobs.get(queue[0])
            if job is None or job.status != "IN_QUEUE" or job.changing:
                queue.popleft()
                continue
            if job.ttl is not None and time.time() > job.created_at + job.ttl:
                await self._finish(job, "TIMED_OUT", error=FunctionTimeoutError(
                    f"the job's ttl of {job.ttl:g} s passed before it could start"))
                continue
            if not await self._start(job):
                await asyncio.sleep(SLOT_POLL)  # invocations outside jobs free slots too: look again soon

    async def _start(self, job: Job) -> bool:
        """Dispatch the first queued job as the tenant it was submitted for (a function since
        redeployed for another tenant does not run it); False while the function is at its
        concurrency here (it stays first in its queue)."""
        principal = Principal(job.tenant, "user")
        if not job.invocation_id:  # stored before jobs had one
            job.invocation_id = new_invocation_id()
        options = InvokeOptions(mode="sse", trace_id=job.id.replace("-", ""), keep_items=True,
                                timeout=job.execution_timeout, accepted=True,  # stored: outlasts a Redis outage
                                invocation_id=job.invocation_id)
        try:
            function = self.dispatcher.find(principal, job.function)
        except FunctionServiceError as exc:  # not deployed (any more), another tenant's...
            await self._finish(job, "FAILED", error=exc)  # the loop drops it from the queue
            return True
        if isinstance(function, Deployment) and function.inflight >= function.spec.concurrency:
            return False  # no slot: nothing is written until one is free
        job.status, job.started_at = "IN_PROGRESS", time.time()  # being dispatched: see _cancel_local
        try:  # stored as running before the handler starts: a restart never runs a finished job again
            await self.writes.save(job)
        except JobStoreError as exc:
            job.status, job.started_at = "IN_QUEUE", None
            self.writes.failed(job, exc)
            await self._finish(job, "FAILED", error=JobStoreError(f"the job could not be started: {exc.message}"))
            return True
        if not self._ours(job) or job.final:  # taken over, or cancelled, while being stored
            return True
        try:
            inv = await self.dispatcher.dispatch(principal, function, job.event, options)
        except ConcurrencyLimitError:  # the slot went while the write was awaited (stored running: the
            job.status, job.started_at = "IN_QUEUE", None  # restart rules would run it, as it never ran)
            return False
        except FunctionServiceError as exc:  # no cluster worker...
            job.status = "IN_QUEUE"
            await self._finish(job, "FAILED", error=exc)
            return True
        if not self._ours(job):  # taken over by another node while being dispatched
            inv.cancel(_TAKEN_OVER)
            return True
        queue = self._queues[job.key]
        queue.remove(job.id)  # the first, unless the queue changed while a cluster submit was awaited
        self._count_queued(job, -1)
        self._running[job.id] = inv
        self._notify(job)
        if job.cancel_requested:
            inv.cancel("the job was cancelled")
        self.spawn(collect(self, job, function, inv), f"job-{job.id}")
        return True

    async def _finish(self, job: Job, status: Status, *, result: Any = None,
                      error: FunctionServiceError | None = None) -> None:
        """Store the job's end, then show it: a COMPLETED job is durable before anyone sees it. When
        the store refuses it (after retries) the job is FAILED instead, counted and logged, and that
        end is kept in `writes.unsaved` to be stored once the store takes writes again."""
        if not self._ours(job) or job.final or job.changing:
            return  # another node took it over (_taken_from_us), or its end is being stored already
        assert status in FINAL
        job.changing = True
        try:
            ended = job.ended(status, result, error)
            try:
                await self.writes.save(ended)
            except JobStoreError as exc:
                self.writes.failed(job, exc)
                ended = job.ended("FAILED", None, JobStoreError(
                    f"the job ended {status} but its end could not be stored: {exc.message}"))
                await self.writes.keep_unsaved(job, (ended.error or {}).get("message", ""))  # see _flush_unsaved
                log.warning("jobs: the end of job %s is not stored yet; it is tried again every %g s",
                            job.id, FLUSH_EVERY)
                if self._flusher is None or self._flusher.done():
                    self._flusher = self.spawn(self._flush_unsaved(), "jobs-flush-unsaved")
        finally:
            job.changing = False
        if not self._ours(job):
            return
        if job.status == "IN_QUEUE":
            self._count_queued(job, -1)
        job.take_end(ended)
        self._notify(job)
        for callback in self.on_final:
            try:
                callback(job)
            except Exception:  # a callback's failure must not lose the job's end
                log.exception("jobs: on_final callback failed for job %s", job.id)
        if job.id not in self.writes.unsaved:  # what the store holds can be read back
            self._keep(job)

    # -- expiry ------------------------------------------------------------------------------
    async def _flush_unsaved(self) -> None:
        """Every FLUSH_EVERY seconds, store the final states the store refused, until all are."""
        while self.writes.unsaved:
            await asyncio.sleep(FLUSH_EVERY)
            await self.writes.flush()

    async def _sweep(self) -> None:
        interval = min(SWEEP_EVERY, max(0.05, self.config.retentionSeconds / 4))
        while True:
            await asyncio.sleep(interval)
            await self.expire()

    async def expire(self, now: float | None = None) -> int:
        """Forget finished jobs older than jobs.retentionSeconds (memory and store)."""
        limit = (now or time.time()) - self.config.retentionSeconds
        old = [j.id for j in self.jobs.values() if j.final and j.completed_at is not None and j.completed_at < limit]
        for job_id in old:
            del self.jobs[job_id]
            self._changed.pop(job_id, None)
            self.bytes.forget(job_id)
            self.writes.forget(job_id)
            if self.cache is not None:
                self.cache.forget(job_id)
        if old:
            await self.writes.delete(old)
        return len(old)

