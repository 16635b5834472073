"""Building the aiohttp application, and running it as a server."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from runtime.config import Config
from runtime.dispatch import Dispatcher, Limits
from runtime.durable import DurableOutputs
from runtime.eventloop import loop_name
from runtime.executor import Executor
from runtime.java.build import java_unavailable
from runtime.lifecycle import Lifecycle, wait_for_stop_signal
from runtime.manifest import load_deploy_dir
from runtime.quotas import Quotas
from runtime.registry import Registry
from runtime.streams import AbstractBroker, BrokerSettings, MemoryBroker, bind_broker, unbind_broker

from . import (
    api_table,  # noqa: F401 - its rows describe the routes for /openapi.json
    openapi,
)
from .auth import auth_middleware
from .cors import cors_middleware, install_cors
from .errors import error_middleware
from .hosts import HOST_POLICY, HostPolicy, host_middleware
from .jobs import attach_jobs
from .keys import BROKER, CONFIG, DISPATCHER, EXECUTOR, LIFECYCLE, OUTPUTS, REGISTRY, TRACE_ID
from .metrics import install_metrics
from .routes import (
    admin,
    console,
    health,
    invocations,
    invoke,
    jobs,
    openai,
    runpod,
    sessions,
    streams,
    yr_functions,
)
from .server import FnstreamRunner, raise_fd_limit, start_site

__all__ = ("build_app", "build_registry", "serve", "SERVER_KWARGS")

log = logging.getLogger("fnstream.frontend")


class AccessLogger(AbstractAccessLogger):
    """One line per request, without the query string: `?token=` must not reach the logs."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %d %.1fms", request.remote, request.method, request.path,
                         response.status, time * 1000, extra={"trace_id": request.get(TRACE_ID, "")})


# aiohttp cancels a request's handler when its client disconnects only when asked to; fnstream
# relies on it to cancel invocations of clients that left.
SERVER_KWARGS: dict[str, Any] = {"handler_cancellation": True, "access_log_class": AccessLogger}


def build_registry(config: Config, *, deploy: bool = True) -> Registry:
    """A registry with every manifest of `runtime.deployDir` deployed (all or nothing)."""
    quotas = Quotas(config.tenants.maxFunctions, config.tenants.maxInstancesPerFunction,
                    config.runtime.maxWorkerProcesses)
    registry = Registry(config.runtime.codeRoots, stop_grace=config.frontend.args.shutdownGraceSeconds,
                        quotas=quotas)
    if deploy and config.runtime.deployDir is not None:
        specs = load_deploy_dir(config.runtime.deployDir)
        missing = java_unavailable("(any Java function)") if any(s.is_java for s in specs) else None
        if missing is not None:  # the server serves everything else; a Java deploy says what to install
            log.error("not deploying the Java functions of %s: %s", config.runtime.deployDir, missing)
            specs = [s for s in specs if not s.is_java]
        registry.deploy(specs)
    return registry


def build_app(config: Config, registry: Registry | None = None, executor: Executor | None = None,
              broker: AbstractBroker | None = None) -> web.Application:
    body_limit = int(config.frontend.args.maxRequestBodySize * 1024 * 1024)
    # Without tokens auth is off: no middleware at all rather than one that checks and passes.
    # The Origin guard runs before auth: a foreign page's request is refused before anything else.
    # The Host guard (DNS rebinding) runs first of all, right after the JSON error shape.
    hosts = HostPolicy(config)
    middlewares = [error_middleware, *(() if hosts.any else (host_middleware,)), cors_middleware,
                   *((auth_middleware,) if config.auth.tokens else ())]
    app = web.Application(middlewares=middlewares, client_max_size=body_limit)
    app[CONFIG] = config
    app[HOST_POLICY] = hosts
    app[REGISTRY] = registry if registry is not None else build_registry(config)
    app[EXECUTOR] = executor if executor is not None else Executor(config.runtime.threadPoolSize,
                                                                     config.runtime.threadsPerFunction,
                                                                     config.runtime.cpuBoundThreadsPerFunction,
                                                                     config.runtime.burningSwitchInterval,
                                                                     threads_per_tenant=config.runtime.threadsPerTenant)
    app[DISPATCHER] = Dispatcher(app[REGISTRY], app[EXECUTOR], Limits.from_config(config))
    app[LIFECYCLE] = Lifecycle(app[EXECUTOR], app[REGISTRY], config.frontend.args.shutdownGraceSeconds)
    # Named streams live in this process, or in Redis in cluster mode (attach_cluster replaces it).
    app[BROKER] = broker if broker is not None else MemoryBroker(BrokerSettings.from_config(config.streams))
    app.add_routes(health.routes)
    app.add_routes(invoke.routes)
    app.add_routes(invocations.routes)  # an SSE invocation's kept output, by its id
    app.add_routes(sessions.routes)
    app.add_routes(admin.routes)
    app.add_routes(yr_functions.routes)  # openYuanrong's function registration
    app.add_routes(streams.routes)
    app.add_routes(openai.routes)
    app.add_routes(jobs.routes)    # [jobs] /serverless/v1/jobs..., async-results
    app.add_routes(runpod.routes)  # [jobs] RunPod's /v2/{fn}/...
    app.add_routes(console.routes)
    app.add_routes(openapi.routes)  # described by the rows of api_table
    install_cors(app)
    install_metrics(app)

    async def _run_lifecycle(app: web.Application) -> AsyncIterator[None]:
        # Leaving it closes the process pools, runs every preStop and stops the thread pool.
        async with app[LIFECYCLE]:
            yield

    app.cleanup_ctx.append(_run_lifecycle)

    async def _drain_invocations(app: web.Application) -> None:
        # Runs after the listener stopped and before aiohttp waits for open responses: aborted
        # invocations end their SSE responses with an error event and [DONE]; named-stream
        # subscribers get `event: end` (reason shutdown) as the Lifecycle says.
        await app[LIFECYCLE].drain()

    app[streams.OPEN_SUBSCRIPTIONS] = subscriptions = streams.OpenSubscriptions()
    app[LIFECYCLE].end_streams.append(subscriptions.end_all)
    app.on_shutdown.append(_drain_invocations)

    async def _bind_broker(app: web.Application) -> AsyncIterator[None]:
        # Handlers reach the broker through runtime.create_stream_producer() & co. (runtime/streams/api.py).
        broker = app[BROKER]
        bind_broker(broker, asyncio.get_running_loop())
        yield
        unbind_broker(broker)
        await broker.close()

    app.cleanup_ctx.append(_bind_broker)
    streams_cfg = config.streams
    app[OUTPUTS] = outputs = DurableOutputs(
        lambda: app[BROKER], seconds=streams_cfg.invocationRetentionSeconds,
        max_bytes=streams_cfg.invocationRetentionBytes, count=streams_cfg.invocationRetentionCount,
        shared=lambda: bool(config.cluster.redisUrl))

    async def _close_outputs(app: web.Application) -> None:
        await outputs.close()  # after the drain: detached invocations were aborted, their pumps end

    app.on_shutdown.append(_close_outputs)
    if config.cluster.redisUrl:  # cluster mode: registry, queue and streams shared through Redis
        from .cluster import attach_cluster
        attach_cluster(app)
    # [jobs] job store, runner and webhooks; after the cluster node, so recovered jobs start once it runs
    attach_jobs(app)
    return app


async def serve(app: web.Application, host: str, port: int, *, shutdown_timeout: float = 10.0) -> None:
    """Run until SIGINT/SIGTERM, then stop accepting and give open requests time to finish."""
    config = app[CONFIG]
    raise_fd_limit(config.frontend.limits.maxConnections)
    runner = FnstreamRunner(app, config.frontend.limits, shutdown_timeout=shutdown_timeout, **SERVER_KWARGS)
    await runner.setup()
    try:  # a listener that cannot start still stops what setup started (a cluster node's tasks)
        await start_site(runner, config, host, port)
        log.info("fnstream listening on http://%s:%d (%d functions, %s loop)", host, port, len(app[REGISTRY]),
                 loop_name(asyncio.get_running_loop()))
        print(f"fnstream listening on http://{host}:{port}", flush=True)
        await wait_for_stop_signal()
    finally:
        log.info("shutting down")
        await runner.cleanup()
