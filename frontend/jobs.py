"""Jobs in the HTTP frontend: the job manager's lifetime, the store of admin-deployed functions,
and the lookup every job route shares (tenant, job of this function).

At start the store is opened, functions deployed through the admin API are deployed again
(a stored function replaces a `deployDir` manifest of the same name: it is the later change),
then stored jobs are recovered. The manager is the dispatcher's job queue (`submit_job`) and
starts jobs through `dispatch`. At shutdown it starts no more jobs before the drain (one of
the Lifecycle's `stop_intake`), and at cleanup it stops and the store is closed.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable

from aiohttp import web

from runtime.config import Config
from runtime.deployment import Deployment, function_key
from runtime.errors import ConfigError, FunctionServiceError
from runtime.invocation_ids import INVOCATION_ID_HEADER
from runtime.jobs.idempotency import IdempotentSubmits
from runtime.jobs.model import Job
from runtime.jobs.runner import JobManager
from runtime.jobs.store import JobStore, MemoryJobStore, SqliteJobStore
from runtime.jobs.webhooks import WebhookSender
from runtime.manifest import FunctionSpec

from .auth import principal_of
from .keys import CONFIG, DISPATCHER, LIFECYCLE, REGISTRY

__all__ = (
    "IDEMPOTENCY",
    "JOBS",
    "JOB_STORE",
    "WEBHOOKS",
    "attach_jobs",
    "find_job",
    "forget_function",
    "job_headers",
    "remember_functions",
)

log = logging.getLogger("fnstream.frontend")

JOBS = web.AppKey("jobs", JobManager)
WEBHOOKS = web.AppKey("webhooks", WebhookSender)
JOB_STORE = web.AppKey("job_store", JobStore)
IDEMPOTENCY = web.AppKey("idempotency", IdempotentSubmits)


def attach_jobs(app: web.Application) -> None:
    """Run a JobManager (and its store and webhook sender) for the app's lifetime."""
    config = app[CONFIG]
    store = _build_store(config)
    dispatcher = app[DISPATCHER]
    manager = JobManager(config.jobs, dispatcher, store)
    webhooks = WebhookSender(config.jobs.webhook)
    manager.on_final.append(webhooks.job_ended)
    idempotency = IdempotentSubmits(store.idempotency_keys(), config.jobs.idempotencySeconds)
    app[IDEMPOTENCY] = idempotency
    app[JOB_STORE] = store
    app[JOBS] = manager
    app[WEBHOOKS] = webhooks
    dispatcher.jobs = manager  # Dispatcher.submit_job: X-Invoke-Type async, RunPod's /run
    # Before the drain aborts running jobs: they stay IN_PROGRESS (the restart rules apply).
    app[LIFECYCLE].stop_intake.append(manager.stop_taking)
    # Then /runsync, job long-polls and job streams answer with the job as it is: none waits for an
    # end that a job the drain aborts only gets after a restart (aiohttp would hold it past the grace).
    app[LIFECYCLE].end_streams.append(manager.release_readers)

    async def _jobs(app: web.Application) -> AsyncIterator[None]:
        await store.open()
        await idempotency.open()
        await _restore_functions(app, store)
        await manager.start()
        yield
        await manager.stop()
        await webhooks.close()

    app.cleanup_ctx.append(_jobs)


def _build_store(config: Config) -> JobStore:
    """The store `jobs.store` names; `auto` is redis in cluster mode (cluster.redisUrl), else sqlite."""
    kind = config.jobs.store
    if kind == "auto":
        kind = "redis" if config.cluster.redisUrl else "sqlite"
    if kind == "sqlite":
        return SqliteJobStore(config.jobs.path)
    if kind == "memory":
        return MemoryJobStore()
    if not config.cluster.redisUrl:
        raise ConfigError("jobs.store: redis needs cluster mode (cluster.redisUrl)")
    from runtime.cluster.job_store import connect_store  # cluster mode only: it imports redis

    return connect_store(config.cluster.redisUrl, config.cluster.keyPrefix, config.jobs.retentionSeconds,
                         config.jobs.takeoverSeconds)


async def _restore_functions(app: web.Application, store: JobStore) -> None:
    registry = app[REGISTRY]
    for key, data in await store.load_functions():
        name = data.get("name", "?")
        try:
            spec = FunctionSpec.model_validate(data)
            own_key = function_key(spec.tenant, spec.name)
            if own_key != key:  # stored before names were per tenant (keyed by the bare name): re-key it
                await store.save_function(own_key, data)
                await store.delete_function(key)
            if own_key in registry:
                log.warning("function %s: the deployment stored through the admin API replaces the deployDir "
                            "manifest of the same name", own_key)
            await registry.adeploy([spec])
        except (FunctionServiceError, ValueError) as exc:
            message = exc.message if isinstance(exc, FunctionServiceError) else str(exc)
            log.error("function %s stored through the admin API could not be deployed again: %s", name, message)


async def remember_functions(app: web.Application, deps: Iterable[Deployment]) -> None:
    """[jobs hook, admin API] Store what the admin API deployed, before the response goes out
    (keyed by tenant and name: two tenants' functions of one name are two records)."""
    store = app.get(JOB_STORE)
    if store is not None:
        for dep in deps:
            await store.save_function(dep.key, dep.spec.model_dump(mode="json"))


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
