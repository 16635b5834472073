"""Jobs in the HTTP frontend: the node's job objects as app keys, the store of admin-deployed
functions, and the lookup every job route shares (tenant, job of this function).

The node (runtime/node.py) builds, starts and stops the store, the manager and the webhook
sender; it deploys again what the admin API stored before it recovers stored jobs.
"""
from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from runtime.deployment import Deployment
from runtime.invocation_ids import INVOCATION_ID_HEADER
from runtime.jobs.idempotency import IdempotentSubmits
from runtime.jobs.model import Job
from runtime.jobs.runner import JobManager
from runtime.jobs.store import JobStore
from runtime.jobs.webhooks import WebhookSender
from runtime.node import Node

from .auth import principal_of

__all__ = (
    "IDEMPOTENCY",
    "JOBS",
    "JOB_STORE",
    "WEBHOOKS",
    "set_job_keys",
    "find_job",
    "forget_function",
    "job_headers",
    "remember_functions",
)

JOBS = web.AppKey("jobs", JobManager)
WEBHOOKS = web.AppKey("webhooks", WebhookSender)
JOB_STORE = web.AppKey("job_store", JobStore)
IDEMPOTENCY = web.AppKey("idempotency", IdempotentSubmits)


def set_job_keys(app: web.Application, node: Node) -> None:
    """The node's job manager, store, webhook sender and idempotent submits, for the job routes."""
    assert node.jobs is not None and node.store is not None
    assert node.webhooks is not None and node.idempotency is not None
    app[JOBS] = node.jobs
    app[JOB_STORE] = node.store
    app[WEBHOOKS] = node.webhooks
    app[IDEMPOTENCY] = node.idempotency


async def remember_functions(app: web.Application, deps: Iterable[Deployment]) -> None:
    """[jobs hook, admin API] Store what the admin API deployed, before the response goes out
    (keyed by tenant and name: two tenants' functions of one name are two records)."""
    store = app.get(JOB_STORE)
    if store is not None:
        for dep in deps:
            await store.save_function(dep.key, dep.spec.record())


async def forget_function(app: web.Application, key: str) -> None:
    """[jobs hook, admin API] A deleted function (its `function_key`) does not come back at the next start."""
    store = app.get(JOB_STORE)
    if store is not None:
        await store.delete_function(key)


async def find_job(request: web.Request, job_id: str, function: str | None = None) -> Job:
    """The job (in cluster mode also one another node runs), visible to this request's tenant
    (404 for another tenant's, as for an unknown id)."""
    return await request.app[JOBS].lookup(job_id, principal_of(request), function)


def job_headers(job: Job, *extra: dict[str, str] | None) -> dict[str, str]:
    """A job answer's headers: `X-Invocation-Id`, the id its run's invocation has (named at submit
    time, so the answer, the run's log lines and its metrics agree), and any `extra`."""
    headers = {INVOCATION_ID_HEADER: job.invocation_id} if job.invocation_id else {}
    for more in extra:
        if more:
            headers.update(more)
    return headers
