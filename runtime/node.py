"""One fnstream node's runtime, built in one place from `Config`: the composition root.

`Node(config)` builds, in order and without I/O, the registry (every `deployDir` manifest deployed,
with the tenant and worker-process quotas), the executor, the cluster membership (cluster mode:
`runtime/cluster/node.py` ClusterNode), the named-stream broker (in process, or Redis), the kept
output of SSE invocations, the job store, manager and webhook sender, the dispatcher and the
shutdown sequence (`Lifecycle`). Each object gets what it needs when it is made: nothing is
attached after construction. `async with node:` starts them (broker bound for handlers, cluster
tasks, job store opened, admin-deployed functions deployed again, stored jobs recovered) and
leaving it shuts them down in the reverse order, after `Lifecycle.drain`.

`fnstream serve` (through `frontend/app.py` build_app) and the test apps run a serving node;
`fnstream worker` runs `Node(config, worker_only=True)`: a cluster node that runs handlers only
(no jobs, no kept outputs, functions from the shared registry, not from `deployDir`).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from .config import Config
from .deployment import function_key
from .dispatch import Dispatcher, Limits
from .durable import DurableOutputs
from .errors import ConfigError, FunctionServiceError
from .executor import Executor
from .executors import kind_named
from .heap import freeze_startup
from .java.build import java_unavailable
from .jobs.idempotency import IdempotentSubmits
from .jobs.model import Job
from .jobs.runner import JobManager
from .jobs.store import JobStore, MemoryJobStore, SqliteJobStore
from .jobs.webhooks import WebhookSender
from .lifecycle import Lifecycle, wait_for_stop_signal
from .manifest import FunctionSpec, load_deploy_dir
from .quotas import Quotas
from .registry import Registry
from .streams import AbstractBroker, BrokerSettings, MemoryBroker, bind_broker, unbind_broker
from .tasks import stop_tasks

if TYPE_CHECKING:  # cluster mode only: those modules import redis
    from .cluster.invocation_cancels import InvocationCancels
    from .cluster.node import ClusterNode

__all__ = ("Node", "build_registry", "build_job_store", "restore_functions", "serve_worker")

log = logging.getLogger("fnstream.runtime")


def build_registry(config: Config, *, deploy: bool = True) -> Registry:
    """A registry with the node's quotas and (`deploy`) every manifest of `runtime.deployDir`
    deployed, all or nothing."""
    quotas = Quotas(config.tenants.maxFunctions, config.tenants.maxInstancesPerFunction,
                    config.runtime.maxWorkerProcesses)
    args = config.frontend.args
    registry = Registry(config.runtime.codeRoots, stop_grace=args.shutdownGraceSeconds,
                        pre_stop_grace=args.preStopGraceSeconds, quotas=quotas)
    if deploy and config.runtime.deployDir is not None:
        specs = load_deploy_dir(config.runtime.deployDir)
        missing = java_unavailable("(any Java function)") if any(s.is_java for s in specs) else None
        if missing is not None:  # the server serves everything else; a Java deploy says what to install
            log.error("not deploying the Java functions of %s: %s", config.runtime.deployDir, missing)
            specs = [s for s in specs if not s.is_java]
        registry.deploy(specs)
    return registry


def build_job_store(config: Config) -> JobStore:
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
    from .cluster.job_store import connect_store  # cluster mode only: it imports redis

    return connect_store(config.cluster.redisUrl, config.cluster.keyPrefix, config.jobs.retentionSeconds,
                         config.jobs.takeoverSeconds)


async def restore_functions(registry: Registry, store: JobStore) -> None:
    """Deploy again what the admin API deployed (a stored function replaces a `deployDir` manifest
    of the same name: it is the later change); one that fails is logged and skipped, never
    deleted from the store (e.g. a runtime.maxWorkerProcesses lowered since: the next start with
    room deploys it)."""
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
            log.error("function %s stored through the admin API could not be deployed again: %s (its stored "
                      "deployment is kept: it comes back at the next start that has room for it, or "
                      "deploy it again)", name, message)


class Node:
    """Every runtime object of one node, built from `config`; `async with` runs them.

    `registry` (optional) is one already built, e.g. by `fnstream serve` to report a bad manifest
    before anything starts. `end_streams` are what end the readers that are not invocations
    (the frontend's named-stream subscribers; `Lifecycle.end_streams`). `job_hooks` are told of
    each job's end after the webhook sender (`JobManager.on_final`: the frontend's job metrics).
    """

    def __init__(self, config: Config, *, worker_only: bool = False, registry: Registry | None = None,
                 end_streams: Iterable[Callable[[], Awaitable[None]]] = (),
                 job_hooks: Iterable[Callable[[Job], None]] = ()) -> None:
        self.config = config
        self._job_hooks = tuple(job_hooks)
        rt = config.runtime
        grace = config.frontend.args.shutdownGraceSeconds
        self.registry = registry if registry is not None else build_registry(config, deploy=not worker_only)
        self.executor = Executor(rt.threadPoolSize, rt.threadsPerFunction, rt.cpuBoundThreadsPerFunction,
                                 rt.burningSwitchInterval, threads_per_tenant=rt.threadsPerTenant)
        self.cluster: ClusterNode | None = None
        self.cancels: InvocationCancels | None = None
        if config.cluster.redisUrl:  # registry, queue and named streams shared through Redis
            from .cluster.invocation_cancels import InvocationCancels
            from .cluster.node import ClusterNode

            self.cluster = ClusterNode(config, self.registry, self.executor,
                                       role="worker" if worker_only else None)
            self.executor.forward(kind_named("remote"), self.cluster)   # calls the cluster's workers run
            self.broker: AbstractBroker = self.cluster.broker  # every node sees every stream
        elif worker_only:
            raise ConfigError("a worker node needs cluster mode (cluster.redisUrl)")
        else:
            self.broker = MemoryBroker(BrokerSettings.from_config(config.streams))
        self.outputs: DurableOutputs | None = None
        self.store: JobStore | None = None
        self.jobs: JobManager | None = None
        self.webhooks: WebhookSender | None = None
        self.idempotency: IdempotentSubmits | None = None
        if not worker_only:
            if self.cluster is not None:  # a cancel by id may reach another frontend than the answering one
                self.cancels = InvocationCancels(self.cluster.redis, self.cluster.keys)
            sc = config.streams
            self.outputs = DurableOutputs(self.broker, seconds=sc.invocationRetentionSeconds,
                                          max_bytes=sc.invocationRetentionBytes,
                                          count=sc.invocationRetentionCount, shared=self.cluster is not None,
                                          send_cancel=None if self.cancels is None else self.cancels.send)
            self.store = build_job_store(config)
            self.webhooks = WebhookSender(config.jobs.webhook)
            self.idempotency = IdempotentSubmits(self.store.idempotency_keys(config.jobs.idempotencySeconds),
                                                 config.jobs.idempotencySeconds)
        # Functions are found and run here or (cluster mode) queued for the cluster's workers;
        # background jobs (Dispatcher.submit_job) go to the job manager, which runs them through dispatch.
        self.dispatcher = Dispatcher(self.registry, self.executor, Limits.from_config(config), cluster=self.cluster,
                                     jobs=None if self.store is None else self._job_manager)
        # Shutdown stops intake first: no queued work taken, no job started (running jobs stay IN_PROGRESS).
        stop_intake = [*(() if self.cluster is None else (self.cluster.stop_taking,)),
                       *(() if self.jobs is None else (self.jobs.stop_taking,))]
        # Then the readers that are no invocations end: named-stream subscribers, and requests waiting on
        # a job (/runsync, long-polls, job streams) answer with the job as it is, within the grace.
        end = [*end_streams, *(() if self.jobs is None else (self.jobs.release_readers,))]
        self.lifecycle = Lifecycle(self.executor, self.registry, grace, stop_intake=stop_intake, end_streams=end)
        self._stack = contextlib.AsyncExitStack()
        self._drained: int | None = None

    def _job_manager(self, dispatcher: Dispatcher) -> JobManager:
        assert self.store is not None and self.webhooks is not None
        self.jobs = JobManager(self.config.jobs, dispatcher, self.store,
                               on_final=(self.webhooks.job_ended, *self._job_hooks))
        return self.jobs

    @property
    def role(self) -> str:
        """`all` without cluster mode, else the cluster node's role (`all`, `frontend` or `worker`)."""
        return "all" if self.cluster is None else self.cluster.role

    async def __aenter__(self) -> Node:
        stack = self._stack
        async with contextlib.AsyncExitStack() as starting:
            await starting.enter_async_context(self.lifecycle)  # leaving it closes pools, preStops, threads
            bind_broker(self.broker, asyncio.get_running_loop())  # runtime.create_stream_producer() & co.
            starting.push_async_callback(self._close_broker)
            if self.cluster is not None:
                await self.cluster.start()
                starting.push_async_callback(self.cluster.stop)
            if self.cancels is not None and self.outputs is not None:
                listener = asyncio.create_task(self.cancels.listen(self.outputs.cancel_here),
                                               name="cluster-invocation-cancels")
                starting.push_async_callback(stop_tasks, (listener,), "invocation cancels")
            # After the cluster node: recovered jobs start once it runs.
            if self.jobs is not None and self.store is not None and self.idempotency is not None:
                await self.store.open()
                starting.push_async_callback(self._stop_jobs)
                await self.idempotency.open()
                await restore_functions(self.registry, self.store)
                await self.jobs.start()
            starting.push_async_callback(self.drain)
            stack.push_async_exit(starting.pop_all())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.aclose()

    async def drain(self) -> int:
        """Stop intake and let in-flight invocations finish within the grace (Lifecycle.drain), then
        stop the kept outputs' pumps; the HTTP server calls it once its listener has stopped, before
        it waits for open responses. The number of invocations aborted."""
        if self._drained is None:
            aborted = await self.lifecycle.drain()
            if self.outputs is not None and self._drained is None:
                await self.outputs.close()  # after the drain: detached invocations were aborted, their pumps end
            self._drained = aborted
        return self._drained

    async def _stop_jobs(self) -> None:
        assert self.jobs is not None and self.webhooks is not None
        await self.jobs.stop()  # closes the store
        await self.webhooks.close()

    async def _close_broker(self) -> None:
        unbind_broker(self.broker)
        await self.broker.close()

    @property
    def abandoned_threads(self) -> int:
        """After shutdown: how many handler threads were still running (lifecycle.exit_after_shutdown)."""
        return self.lifecycle.abandoned_threads


async def serve_worker(config: Config) -> int:
    """`fnstream worker`: run a worker-only node until SIGINT/SIGTERM, then shut down as `serve` does:
    take no more work, let running invocations finish within `shutdownGraceSeconds`, run preStops.
    Returns how many handler threads were abandoned (runtime/lifecycle.py exit_after_shutdown)."""
    from .cluster.settings import describe_url

    node = Node(config, worker_only=True)
    cluster = node.cluster
    assert cluster is not None
    async with node:
        print(f"fnstream worker {cluster.id} on {describe_url(cluster.url)}", flush=True)
        freeze_startup()  # full collections walk only what serving makes (runtime/heap.py)
        await wait_for_stop_signal()
        log.info("worker %s: shutting down (grace %g s)", cluster.id, config.frontend.args.shutdownGraceSeconds)
    return node.abandoned_threads
