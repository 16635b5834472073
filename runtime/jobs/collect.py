"""A running job's output: each batch of the invocation's items stored, then shown, until the
invocation ends; then the job's end, recorded by the manager (JobManager._finish)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..codec import Item, encode_payload
from ..deployment import Deployment, FunctionRef
from ..errors import FunctionServiceError, FunctionTimeoutError, ServiceUnavailableError
from ..invocation import Invocation
from .errors import JobItemError, JobOutputTooLargeError, JobStoreError
from .model import Job
from .refresh import refresh_instance, take_refresh_flag

if TYPE_CHECKING:
    from ..surface import InvocationSurface
    from .host import JobHost

__all__ = ("cancelled", "collect")


def _error_text(error: Any) -> str:
    return error if isinstance(error, str) else encode_payload(error)


def cancelled(message: str = "the job was cancelled") -> FunctionServiceError:
    return FunctionServiceError(message, code=200499, status=499)


def _error_item(job: Job, value: Any) -> FunctionServiceError | None:
    """RunPod: a generator item `{"error": ...}` ends the job as FAILED with that error."""
    if job.api == "runpod" and isinstance(value, dict) and value.get("error"):
        return JobItemError(_error_text(value["error"]))
    return None

async def collect(manager: JobHost, job: Job, function: FunctionRef, inv: InvocationSurface) -> None:
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
                    stopped = _error_item(job, payload.value)
                else:
                    values.append(str(payload))
                job.output_bytes += len(payload.encode())
                if stopped:
                    break  # RunPod: a yielded {"error": ...} ends the job; what follows is not output
            if job.output_bytes > manager.config.maxOutputBytes:
                stopped = JobOutputTooLargeError(f"the job's output exceeds jobs.maxOutputBytes "
                                                 f"({manager.config.maxOutputBytes} bytes)")
                inv.cancel(stopped.message)
                break
            first = len(job.outputs) + 1
            try:  # stored before any reader sees it: what was shown is what a restart finds
                await manager.writes.add_outputs(job, first, values)
            except JobStoreError as exc:
                manager.writes.failed(job, exc)
                stopped = JobStoreError(f"output item(s) from {first} on could not be stored: {exc.message}")
                inv.cancel(stopped.message)
                break
            job.outputs.extend(values)
            manager.bytes.outputs(job)
            manager._notify(job)
            if stopped:
                inv.cancel(stopped.message)
        try:
            result = await inv.outcome()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the manager is stopping
            await manager._finish(job, "FAILED" if stopped else "CANCELLED", error=stopped or cancelled())
            return
        except FunctionServiceError:
            if stopped is None:
                raise
            result = None  # the cancel that `stopped` caused
        if stopped is not None:
            await manager._finish(job, "FAILED", error=stopped)
            return
        if result is None and isinstance(function, Deployment) and function.kind in ("gen", "asyncgen"):
            # RunPod's return_aggregate_stream; the sync JSON answer. A worker process (or a cluster
            # worker) sends its generator items as stream writes (text), so there every output item is one.
            in_process = isinstance(inv, Invocation) and function.in_process
            result = generator_items if in_process else list(job.outputs)
            job.aggregated = True
            if job.api == "runpod" and function.runpod_aggregates is False:
                result = []  # RunPod without return_aggregate_stream: the items are read with /stream only
        refresh = False
        if job.api == "runpod":
            result, refresh = take_refresh_flag(result)
        if isinstance(function, Deployment) and function.code is not None and (
                refresh or (function.code.runpod is not None and function.code.runpod.refresh_worker)):
            await refresh_instance(function, list(manager.dispatcher.registry.code_roots))
        if job.api == "runpod" and isinstance(result, dict) and result.get("error"):
            await manager._finish(job, "FAILED", error=JobItemError(_error_text(result["error"])))
            return
        await manager._finish(job, "COMPLETED", result=result)
    except FunctionTimeoutError as exc:
        limit = job.execution_timeout
        timed_out: FunctionServiceError = exc
        if limit is not None and limit < inv.spec.timeout:  # the invocation's message names the function's
            timed_out = FunctionTimeoutError(f"the job timed out after its policy.executionTimeout of {limit:g} s")
        await manager._finish(job, "TIMED_OUT", error=timed_out)
    except FunctionServiceError as exc:
        if manager.stopping and isinstance(exc, ServiceUnavailableError):
            return  # aborted by shutdown: stays IN_PROGRESS in the store (the restart rules apply)
        await manager._finish(job, "CANCELLED" if job.cancel_requested else "FAILED",
                     error=cancelled() if job.cancel_requested else exc)
    finally:
        manager._running.pop(job.id, None)
