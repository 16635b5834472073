"""Jobs in the HTTP frontend: the job manager's lifetime, the store of admin-deployed functions,
and the checks every job route shares (tenant, job of this function).

At start the store is opened, functions deployed through the admin API are deployed again
(a stored function replaces a `deployDir` manifest of the same name: it is the later change),
then stored jobs are recovered. At stop, dispatching ends and the store is closed.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

from aiohttp import web

from runtime.errors import FunctionNotFoundError, FunctionServiceError
from runtime.jobs.model import Job
from runtime.jobs.runner import JobManager
from runtime.jobs.store import JobStore, build_store
from runtime.jobs.webhooks import WebhookSender
from runtime.manifest import FunctionSpec
from runtime.registry import Deployment

from .keys import CONFIG, EXECUTOR, PRINCIPAL, REGISTRY

__all__ = (
    "JOBS",
    "JOB_STORE",
    "WEBHOOKS",
    "attach_jobs",
    "find_job",
    "forget_function",
    "principal_tenant",
    "remember_functions",
)

log = logging.getLogger("fnstream.frontend")

JOBS = web.AppKey("jobs", JobManager)
WEBHOOKS = web.AppKey("webhooks", WebhookSender)
JOB_STORE = web.AppKey("job_store", JobStore)


def attach_jobs(app: web.Application) -> None:
    """Run a JobManager (and its store and webhook sender) for the app's lifetime."""
    config = app[CONFIG]
    store = build_store(config.jobs.store, config.jobs.path, redis_url=config.cluster.redisUrl,
                        prefix=config.cluster.keyPrefix, retention=config.jobs.retentionSeconds)
    manager = JobManager(config.jobs, config.frontend.args, app[REGISTRY], app[EXECUTOR], store)
    webhooks = WebhookSender(config.jobs.webhook)
    manager.on_final.append(webhooks.job_ended)
    app[JOB_STORE] = store
    app[JOBS] = manager
    app[WEBHOOKS] = webhooks

    async def _jobs(app: web.Application) -> AsyncIterator[None]:
        _route_through_cluster(app, manager)
        await store.open()
        await _restore_functions(app, store)
        await manager.start()
        yield
        await manager.stop()
        await webhooks.close()

    app.cleanup_ctx.append(_jobs)

    async def _stop_dispatching(app: web.Application) -> None:
        manager.stopping = True  # before the executor's drain aborts running jobs: they stay IN_PROGRESS

    app.on_shutdown.insert(0, _stop_dispatching)


def _route_through_cluster(app: web.Application, manager: JobManager) -> None:
    """Cluster mode: a job this node should not run (role frontend, full, code not loadable here)
    goes to the cluster's work queue, as an invocation would (see ClusterNode.should_enqueue)."""
    from .cluster import CLUSTER

    cluster = app.get(CLUSTER)
    if cluster is None:
        return
    registry, args = app[REGISTRY], app[CONFIG].frontend.args

    def target(name: str) -> Any:
        try:
            dep: Any = registry.get(name)
        except FunctionNotFoundError:
            return cluster.lookup(name)  # FunctionNotFoundError when the cluster does not know it either
        return dep if cluster.should_enqueue(dep) else None

    async def submit(dep: Any, event: Any) -> Any:
        return await cluster.submit(dep, event, mode="sse", buffer_events=args.streamBufferEvents,
                                    max_write_size=args.maxWriteSize, max_response_size=args.maxResponseSize,
                                    trace_id=None)

    manager.remote_target = target
    manager.remote_submit = submit


async def _restore_functions(app: web.Application, store: JobStore) -> None:
    registry = app[REGISTRY]
    for data in await store.load_functions():
        name = data.get("name", "?")
        try:
            spec = FunctionSpec.model_validate(data)
            if name in registry:
                log.warning("function %s: the deployment stored through the admin API replaces the deployDir "
                            "manifest of the same name", name)
            await registry.adeploy([spec])
        except (FunctionServiceError, ValueError) as exc:
            message = exc.message if isinstance(exc, FunctionServiceError) else str(exc)
            log.error("function %s stored through the admin API could not be deployed again: %s", name, message)


async def remember_functions(app: web.Application, deps: Iterable[Deployment]) -> None:
    """[jobs hook, admin API] Store what the admin API deployed, before the response goes out."""
    store = app.get(JOB_STORE)
    if store is not None:
        for dep in deps:
            await store.save_function(dep.name, dep.spec.model_dump(mode="json"))


async def forget_function(app: web.Application, name: str) -> None:
    """[jobs hook, admin API] A deleted function does not come back at the next start."""
    store = app.get(JOB_STORE)
    if store is not None:
        await store.delete_function(name)


def principal_tenant(request: web.Request) -> str | None:
    """The tenant of the request's token; None when auth is off (every job is visible)."""
    if not request.app[CONFIG].auth.tokens:
        return None
    principal = request.get(PRINCIPAL)
    return principal.tenant if principal is not None else None


async def find_job(request: web.Request, job_id: str, function: str | None = None) -> Job:
    """The job (in cluster mode also one another node runs), visible to this request's tenant
    (404 for another tenant's, as for an unknown id)."""
    return await request.app[JOBS].lookup(job_id, principal_tenant(request), function)
