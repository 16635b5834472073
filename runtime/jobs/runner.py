"""Runs jobs: a queue per function, started through the ordinary invocation path as slots free up.

A job is a streaming invocation started by `Dispatcher.dispatch` like any request (here, or
queued for a cluster worker: the dispatcher decides); its channel batches become the job's
numbered output items. Queued jobs wait for the function's `concurrency` (a free slot) instead
of getting 429; `jobs.maxQueued` bounds the waiting.
Every change is written through to the store; submit waits for the write, so an acknowledged
job survives kill -9. After a restart: queued jobs run, a running job with no output runs
again, a running job with output is FAILED saying the server restarted.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ..config import JobsConfig
from ..deployment import Deployment, FunctionRef
from ..dispatch import InvokeOptions
from ..errors import ConcurrencyLimitError, FunctionServiceError, FunctionTimeoutError, ServiceUnavailableError
from ..invocation import Invocation, Item, encode_payload
from ..principal import Principal
from ..tasks import stop_tasks
from .errors import JobItemError, JobNotFoundError, JobOutputTooLargeError, JobQueueFullError, JobStateError
from .limits import JobBytes, input_size
from .model import FINAL, Job, JobRequest, Status, new_job_id
from .store import JobStore, SharedStore

if TYPE_CHECKING:
    from ..dispatch import Dispatcher
    from ..surface import InvocationSurface

__all__ = ("JobManager",)

log = logging.getLogger("fnstream.jobs")
_TAKEN_OVER = "another node took the job over"  # the cancel reason of a job taken from this node

SLOT_POLL = 0.02      # seconds between looks for a free slot while a function is at its concurrency
REMOTE_POLL = 0.05    # seconds between reads of a job another node runs (shared store)
SWEEP_EVERY = 60.0    # seconds between expiry sweeps (at most)


def _error_text(error: Any) -> str:
    return error if isinstance(error, str) else encode_payload(error)


class JobManager:
    """Every job of this server: submit, look up, follow, cancel, retry, purge, expire."""

    def __init__(self, config: JobsConfig, dispatcher: Dispatcher, store: JobStore) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.store = store
        self.jobs: dict[str, Job] = {}
        self._queues: dict[str, collections.deque[str]] = {}
        self._dispatchers: dict[str, asyncio.Task[None]] = {}
        self._running: dict[str, InvocationSurface] = {}  # here, or relayed from a cluster worker
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed: dict[str, asyncio.Event] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.on_final: list[Callable[[Job], None]] = []
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
        recovered = requeued = 0
        now = time.time()
        expired: list[str] = []
        for job in await self.store.load():
            if job.final and job.completed_at is not None and job.completed_at + self.config.retentionSeconds < now:
                expired.append(job.id)  # expired while the server was down
                continue
            recovered += job.status == "IN_PROGRESS"
            self._adopt(job, "the server restarted")
            requeued += job.status == "IN_QUEUE"
        if expired:
            self.store.delete(expired)
        if recovered or requeued:
            log.info("jobs: %d queued job(s) after restart (%d were running)", requeued, recovered)
        loop = asyncio.get_running_loop()
        self._sweeper = loop.create_task(self._sweep(), name="jobs-sweeper")
        if self.shared is not None:
            self._tasks.add(loop.create_task(self._take_over(self.shared), name="jobs-takeover"))

    def _adopt(self, job: Job, what: str, *, take_ownership: bool = False) -> None:
        """The restart rules, for a job whose runner is gone (this server before a restart, or a dead
        cluster node): a job that had written output is FAILED — never run twice where a client may
        have seen half of it — and any other unfinished job is queued to run (again) here."""
        self.jobs[job.id] = job
        self.bytes.add_input(job, input_size(job.event))
        self.bytes.outputs(job)
        if job.status == "IN_PROGRESS":
            if job.outputs:
                self._finish(job, "FAILED", error=ServiceUnavailableError(
                    f"{what} while this job was running; it had written {len(job.outputs)} "
                    "output item(s), so it was not run again"))
            else:
                job.status, job.started_at = "IN_QUEUE", None
                take_ownership = True
        if job.status == "IN_QUEUE":
            if take_ownership:
                self.store.save(job)
            self._enqueue(job)

    async def _take_over(self, shared: SharedStore) -> None:
        """Cluster mode: adopt the unfinished jobs of nodes that stopped renewing their lease."""
        while True:
            await asyncio.sleep(shared.lease / 3)
            if self.stopping:
                return
            try:
                await shared.claim_orphans(self._take)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the next round tries again (what was not taken stays)
                log.warning("jobs: could not look for a dead node's jobs: %s", exc)

    def _take(self, job: Job) -> None:
        if job.id not in self.jobs:
            self._adopt(job, "the node running it stopped", take_ownership=True)

    async def stop_taking(self) -> None:
        """Start no more jobs (Lifecycle.stop_intake: before the drain aborts the running ones, which
        then stay IN_PROGRESS in the store and the restart rules apply)."""
        self.stopping = True

    async def stop(self) -> None:
        """Stop dispatching; running jobs stay IN_PROGRESS in the store (the restart rules apply)."""
        self.stopping = True
        tasks = [*self._dispatchers.values(), *self._tasks]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
        await stop_tasks(tasks, "jobs")
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
        job = Job(id=new_job_id(), function=spec.name, tenant=spec.tenant, event=event, api=request.api,
                  webhook=request.webhook, execution_timeout=limit, ttl=request.ttl, raw=spec.rawStream)
        if request.api == "runpod" and isinstance(event, dict):
            event["id"] = job.id  # the handler's event is RunPod's job: {"id", "input"}
        self.jobs[job.id] = job
        self.bytes.add_input(job, size)
        self._enqueue(job)
        try:
            await self.store.save(job)
        except BaseException:
            self._drop_queued(job)
            raise
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
        queue = self._queues.get(job.function)
        if queue is not None and job.id in queue:
            queue.remove(job.id)
            self._count_queued(job, -1)

    def _enqueue(self, job: Job) -> None:
        self._queues.setdefault(job.function, collections.deque()).append(job.id)
        self._count_queued(job, 1)
        task = self._dispatchers.get(job.function)
        if task is None or task.done():
            self._dispatchers[job.function] = asyncio.get_running_loop().create_task(
                self._dispatch(job.function), name=f"jobs-dispatch-{job.function}")

    # -- look up -----------------------------------------------------------------------------
    def get(self, job_id: str, principal: Principal | None = None, function: str | None = None) -> Job:
        """A job of this node; 404 when unknown, of another tenant than the principal's, or of
        another function (as for an unknown id: a job's existence is not another tenant's business)."""
        return _visible(self.jobs.get(job_id), job_id, principal, function)

    async def lookup(self, job_id: str, principal: Principal | None = None, function: str | None = None) -> Job:
        """`get`, or in cluster mode a job another node runs, read from the shared store."""
        job = self.jobs.get(job_id)
        if job is None and self.shared is not None:
            job = await self.shared.fetch(job_id)
            if job is not None:
                job.remote = True
        return _visible(job, job_id, principal, function)

    async def _refresh(self, job: Job) -> None:
        """Re-read a remote job (its new output items appended)."""
        assert self.shared is not None
        newer = await self.shared.fetch(job.id, len(job.outputs))
        if newer is None:
            raise JobNotFoundError(f"job {job.id!r} not found (it expired)")
        job.refresh(newer, newer.outputs)

    def list_jobs(self, principal: Principal | None = None, function: str | None = None,
                  limit: int = 100) -> list[Job]:
        """This node's jobs the principal may see (all when auth is off), newest first."""
        jobs = [j for j in self.jobs.values() if (principal is None or j.tenant == principal.tenant)
                and (function is None or j.function == function)]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)[:limit]

    def changed(self, job: Job) -> asyncio.Event:
        """An event set at the job's next change (a new output item or a new status)."""
        event = self._changed.get(job.id)
        if event is None:
            event = self._changed[job.id] = asyncio.Event()
        return event

    def _notify(self, job: Job) -> None:
        event = self._changed.pop(job.id, None)
        if event is not None:
            event.set()

    async def wait(self, job: Job, timeout: float) -> None:
        """Until the job is final or `timeout` seconds passed."""
        deadline = time.monotonic() + timeout
        while not job.final:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if job.remote:
                await asyncio.sleep(min(left, REMOTE_POLL))
                await self._refresh(job)
                continue
            try:
                await asyncio.wait_for(self.changed(job).wait(), left)
            except TimeoutError:
                return

    async def follow(self, job: Job, after: int = 0, heartbeat: float | None = None) -> AsyncIterator[list[Any]]:
        """Batches of output items after item `after`, live, until the job is final and all are out.

        Yields [] after `heartbeat` seconds without a new item (so the caller can ping)."""
        sent = after
        quiet_since = time.monotonic()
        while True:
            event = self.changed(job)
            if len(job.outputs) > sent:
                batch = job.outputs[sent:]
                sent += len(batch)
                quiet_since = time.monotonic()
                yield batch
                continue
            if job.final:
                return
            if job.remote:  # another node runs it: read the shared store again shortly
                if heartbeat is not None and time.monotonic() - quiet_since >= heartbeat:
                    quiet_since = time.monotonic()
                    yield []
                await asyncio.sleep(REMOTE_POLL)
                await self._refresh(job)
                continue
            try:
                await asyncio.wait_for(event.wait(), heartbeat)
            except TimeoutError:
                yield []

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
        return self._cancel_local(job)

    def _cancel_requested(self, job_id: str) -> None:
        """Another node asked to cancel a job (shared store): cancel it if it is ours and still going."""
        job = self.jobs.get(job_id)
        if job is not None and not job.final:
            self._cancel_local(job)

    def _taken_from_us(self, job_id: str) -> None:
        """Another node took this job (this one stalled past its lease, shared store): stop running it
        here, so its handler does not go on beside the taker's, and forget it; the taker's state is
        read from the store from now on. Nothing of it is finished or announced (webhook) here."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        self._drop_queued(job)
        job.remote = True  # who follows or waits on it here reads the store from now on
        self._notify(job)
        inv = self._running.get(job_id)
        if inv is not None:
            inv.cancel(_TAKEN_OVER)

    def _ours(self, job: Job) -> bool:
        """Still this node's job: `_taken_from_us` forgets a job another node took."""
        return self.jobs.get(job.id) is job

    def _cancel_local(self, job: Job) -> Job:
        inv = self._running.get(job.id)
        if inv is None and job.status == "IN_PROGRESS":  # being handed to the cluster's queue
            job.cancel_requested = True
            return job
        if inv is None:
            self._finish(job, "CANCELLED", error=_cancelled())
        else:
            job.cancel_requested = True
            inv.cancel("the job was cancelled")
        return job

    def retry(self, job: Job) -> Job:
        """Run a FAILED or TIMED_OUT job again (its output starts afresh); 409 otherwise."""
        if job.status not in ("FAILED", "TIMED_OUT"):
            raise JobStateError(f"job {job.id!r} is {job.status}; only a FAILED or TIMED_OUT job can be retried")
        if job.remote:
            raise JobStateError(f"job {job.id!r} ran on another node; retry it through that node")
        self._check_queue_room(job.tenant)
        job.status, job.started_at, job.completed_at = "IN_QUEUE", None, None
        job.result = job.error = job.status_code = None
        job.aggregated = False
        job.outputs, job.output_bytes, job.stream_cursor = [], 0, 0
        self.bytes.outputs(job)
        job.retried += 1
        job.created_at = time.time()
        self.store.clear_outputs(job.id)
        self.store.save(job)
        self._notify(job)
        self._enqueue(job)
        return job

    def purge(self, function: str) -> int:
        """Cancel every queued job of `function`; the number cancelled."""
        queued = [self.jobs[i] for i in self._queues.get(function, ()) if self.jobs[i].status == "IN_QUEUE"]
        for job in queued:
            self._finish(job, "CANCELLED", error=_cancelled("the queue was purged"))
        return len(queued)

    async def advance_stream(self, job: Job) -> list[Any]:
        """RunPod's /stream: the items not returned by /stream before (the cursor is kept; in
        cluster mode in the shared store, so each item is returned once whichever node is asked)."""
        if self.shared is not None:
            return await self.shared.advance_cursor(job.id)
        items = job.outputs[job.stream_cursor:]
        if items:
            job.stream_cursor = len(job.outputs)
            self.store.save(job)
        return items

    def counts(self, function: str) -> dict[str, int]:
        counts = {"completed": 0, "failed": 0, "inProgress": 0, "inQueue": 0, "retried": 0, "cancelled": 0}
        key = {"COMPLETED": "completed", "FAILED": "failed", "TIMED_OUT": "failed", "IN_PROGRESS": "inProgress",
               "IN_QUEUE": "inQueue", "CANCELLED": "cancelled"}
        for job in self.jobs.values():
            if job.function == function:
                counts[key[job.status]] += 1
                counts["retried"] += 1 if job.retried else 0
        return counts

    # -- run ---------------------------------------------------------------------------------
    async def _dispatch(self, function: str) -> None:
        """Start the function's queued jobs in order, each when a concurrency slot is free."""
        queue = self._queues[function]
        while queue and not self.stopping:
            job = self.jobs.get(queue[0])
            if job is None or job.status != "IN_QUEUE":
                queue.popleft()
                continue
            if job.ttl is not None and time.time() > job.created_at + job.ttl:
                self._finish(job, "TIMED_OUT", error=FunctionTimeoutError(
                    f"the job's ttl of {job.ttl:g} s passed before it could start"))
                continue
            if not await self._start(job):
                await asyncio.sleep(SLOT_POLL)  # invocations outside jobs free slots too: look again soon

    async def _start(self, job: Job) -> bool:
        """Dispatch the first queued job as the tenant it was submitted for (a function since
        redeployed for another tenant does not run it); False while the function is at its
        concurrency here (it stays first in its queue)."""
        principal = Principal(job.tenant, "user")
        options = InvokeOptions(mode="sse", trace_id=job.id.replace("-", ""), keep_items=True,
                                timeout=job.execution_timeout)
        job.status, job.started_at = "IN_PROGRESS", time.time()  # being dispatched: see _cancel_local
        try:
            function = self.dispatcher.find(principal, job.function)
            inv = await self.dispatcher.dispatch(principal, function, job.event, options)
        except ConcurrencyLimitError:
            job.status, job.started_at = "IN_QUEUE", None
            return False
        except FunctionServiceError as exc:  # not deployed (any more), another tenant's, no cluster worker...
            job.status = "IN_QUEUE"
            self._finish(job, "FAILED", error=exc)  # the loop drops it from the queue
            return True
        if not self._ours(job):  # taken over by another node while being dispatched
            inv.cancel(_TAKEN_OVER)
            return True
        queue = self._queues[job.function]
        queue.remove(job.id)  # the first, unless the queue changed while a cluster submit was awaited
        self._count_queued(job, -1)
        self._running[job.id] = inv
        self.store.save(job)
        self._notify(job)
        if job.cancel_requested:
            inv.cancel("the job was cancelled")
        task = asyncio.get_running_loop().create_task(self._collect(job, function, inv), name=f"job-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    @staticmethod
    def _error_item(job: Job, value: Any) -> FunctionServiceError | None:
        """RunPod: a generator item `{"error": ...}` ends the job as FAILED with that error."""
        if job.api == "runpod" and isinstance(value, dict) and value.get("error"):
            return JobItemError(_error_text(value["error"]))
        return None

    async def _collect(self, job: Job, function: FunctionRef, inv: InvocationSurface) -> None:
        """Read the invocation's output into the job, then record how it ended."""
        generator_items: list[Any] = []
        stopped: FunctionServiceError | None = None  # output too large, or RunPod's error item
        try:
            while not stopped and (batch := await inv.channel.get_batch()):
                values = []
                for payload in batch:
                    if isinstance(payload, Item):
                        values.append(payload.value)
                        generator_items.append(payload.value)
                        stopped = self._error_item(job, payload.value)
                    else:
                        values.append(str(payload))
                    job.output_bytes += len(payload.encode())
                    if stopped:
                        break  # RunPod: a yielded {"error": ...} ends the job; what follows is not output
                if job.output_bytes > self.config.maxOutputBytes:
                    stopped = JobOutputTooLargeError(f"the job's output exceeds jobs.maxOutputBytes "
                                                     f"({self.config.maxOutputBytes} bytes)")
                    inv.cancel(stopped.message)
                    break
                first = len(job.outputs) + 1
                job.outputs.extend(values)
                self.bytes.outputs(job)
                self._notify(job)
                self.store.add_outputs(job.id, first, values)
                if stopped:
                    inv.cancel(stopped.message)
            try:
                result = await inv.outcome()
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # the manager is stopping
                self._finish(job, "FAILED" if stopped else "CANCELLED", error=stopped or _cancelled())
                return
            except FunctionServiceError:
                if stopped is None:
                    raise
                result = None  # the cancel that `stopped` caused
            if stopped is not None:
                self._finish(job, "FAILED", error=stopped)
                return
            if result is None and isinstance(function, Deployment) and function.kind in ("gen", "asyncgen"):
                # RunPod's return_aggregate_stream; the sync JSON answer. A worker process (or a cluster
                # worker) sends its generator items as stream writes (text), so there every output item is one.
                in_process = isinstance(inv, Invocation) and function.executor != "process"
                result = generator_items if in_process else list(job.outputs)
                job.aggregated = True
            if job.api == "runpod" and isinstance(result, dict) and result.get("error"):
                self._finish(job, "FAILED", error=JobItemError(_error_text(result["error"])))
                return
            self._finish(job, "COMPLETED", result=result)
        except FunctionTimeoutError as exc:
            limit = job.execution_timeout
            timed_out: FunctionServiceError = exc
            if limit is not None and limit < inv.spec.timeout:  # the invocation's message names the function's
                timed_out = FunctionTimeoutError(f"the job timed out after its policy.executionTimeout of {limit:g} s")
            self._finish(job, "TIMED_OUT", error=timed_out)
        except FunctionServiceError as exc:
            if self.stopping and isinstance(exc, ServiceUnavailableError):
                return  # aborted by shutdown: stays IN_PROGRESS in the store (the restart rules apply)
            self._finish(job, "CANCELLED" if job.cancel_requested else "FAILED",
                         error=_cancelled() if job.cancel_requested else exc)
        finally:
            self._running.pop(job.id, None)

    def _finish(self, job: Job, status: Status, *, result: Any = None,
                error: FunctionServiceError | None = None) -> None:
        if not self._ours(job):
            return  # another node took it over (_taken_from_us): its end is the taker's to record
        if job.status == "IN_QUEUE":
            self._count_queued(job, -1)
        assert status in FINAL
        job.status, job.completed_at = status, time.time()
        job.result = result
        job.error = error.to_dict() if error is not None else None
        job.status_code = error.status if error is not None else 200
        self.store.save(job)
        self._notify(job)
        for callback in self.on_final:
            try:
                callback(job)
            except Exception:  # a callback's failure must not lose the job's end
                log.exception("jobs: on_final callback failed for job %s", job.id)

    # -- expiry ------------------------------------------------------------------------------
    async def _sweep(self) -> None:
        interval = min(SWEEP_EVERY, max(0.05, self.config.retentionSeconds / 4))
        while True:
            await asyncio.sleep(interval)
            self.expire()

    def expire(self, now: float | None = None) -> int:
        """Forget finished jobs older than jobs.retentionSeconds (memory and store)."""
        limit = (now or time.time()) - self.config.retentionSeconds
        old = [j.id for j in self.jobs.values() if j.final and j.completed_at is not None and j.completed_at < limit]
        for job_id in old:
            del self.jobs[job_id]
            self._changed.pop(job_id, None)
            self.bytes.forget(job_id)
        if old:
            self.store.delete(old)
        return len(old)


def _visible(job: Job | None, job_id: str, principal: Principal | None, function: str | None) -> Job:
    if job is None or (principal is not None and job.tenant != principal.tenant) or (
            function is not None and job.function != function):
        raise JobNotFoundError(f"job {job_id!r} not found")
    return job


def _cancelled(message: str = "the job was cancelled") -> FunctionServiceError:
    return FunctionServiceError(message, code=200499, status=499)
