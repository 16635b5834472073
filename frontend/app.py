"""Building the aiohttp application, and running it as a server."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from runtime.config import Config
from runtime.eventloop import loop_name
from runtime.heap import freeze_startup
from runtime.lifecycle import wait_for_stop_signal
from runtime.node import Node
from runtime.registry import Registry

from . import (
    api_table,  # noqa: F401 - its rows describe the routes for /openapi.json
    openapi,
)
from .auth import auth_middleware
from .cors import cors_middleware, install_cors
from .errors import error_middleware
from .front_door import INVOKE_LANE, InvokeLane
from .hosts import HOST_POLICY, HostPolicy, host_middleware
from .jobs import set_job_keys
from .keys import BROKER, CONFIG, DISPATCHER, EXECUTOR, LIFECYCLE, NODE, OUTPUTS, REGISTRY, TRACE_ID
from .metrics import install_metrics, job_metrics
from .os_resources import raise_fd_limit
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
from .server import FnstreamRunner, start_site

__all__ = ("build_app", "serve", "SERVER_KWARGS")

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


def build_app(config: Config, registry: Registry | None = None) -> web.Application:
    """The HTTP application over one runtime `Node` (runtime/node.py, the composition root), which
    it runs for its lifetime; `registry` is one built already (`fnstream serve` reports a bad
    manifest before anything starts), else the node deploys `runtime.deployDir`."""
    body_limit = int(config.frontend.args.maxRequestBodySize * 1024 * 1024)
    # Without tokens auth is off: no middleware at all rather than one that checks and passes.
    # The Origin guard runs before auth: a foreign page's request is refused before anything else.
    # The Host guard (DNS rebinding) runs first of all, right after the JSON error shape.
    hosts = HostPolicy(config)
    middlewares = [error_middleware, *(() if hosts.any else (host_middleware,)), cors_middleware,
                   *((auth_middleware,) if config.auth.tokens else ())]
    app = web.Application(middlewares=middlewares, client_max_size=body_limit)
    # Open named-stream subscribers get `event: end` (reason shutdown) as the Lifecycle says.
    app[streams.OPEN_SUBSCRIPTIONS] = subscriptions = streams.OpenSubscriptions()
    job_stats = job_metrics(config)  # finished jobs counted by a hook the node's job manager is built with
    app[NODE] = node = Node(config, registry=registry, end_streams=(subscriptions.end_all,),
                            job_hooks=() if job_stats is None else (job_stats.job_ended,))
    app[CONFIG] = config
    app[HOST_POLICY] = hosts
    app[REGISTRY] = node.registry
    app[EXECUTOR] = node.executor
    app[DISPATCHER] = node.dispatcher
    app[LIFECYCLE] = node.lifecycle
    app[BROKER] = node.broker  # in this process, or Redis in cluster mode
    assert node.outputs is not None
    app[OUTPUTS] = node.outputs
    set_job_keys(app, node)
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
    if node.cluster is not None:  # cluster mode: its admin guard and /cluster/v1/status
        from .cluster import install_cluster  # imports redis: cluster mode only
        install_cluster(app, node.cluster)
    app.add_routes(openapi.routes)  # described by the rows of api_table
    install_cors(app)
    install_metrics(app, job_stats)
    # The one invoke, for the invoke routes and the listener's fast lane (frontend/front_door.py),
    # which does the work of the middlewares and hooks the app has now (and steps aside for others).
    app[invoke.INVOKER] = invoker = invoke.Invoker(app)
    app[INVOKE_LANE] = InvokeLane.of(app, invoker.serve)

    async def _run_node(app: web.Application) -> AsyncIterator[None]:
        # Starts the broker, the cluster node and the jobs; leaving it stops them, closes the
        # process pools, runs every preStop and stops the thread pool.
        async with node:
            yield

    app.cleanup_ctx.append(_run_node)

    async def _drain(app: web.Application) -> None:
        # Runs after the listener stopped and before aiohttp waits for open responses: aborted
        # invocations end their SSE responses with an error event and [DONE].
        await node.drain()

    app.on_shutdown.append(_drain)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    """Run until SIGINT/SIGTERM, then stop accepting and give open requests the grace to finish
    (shutdownGraceSeconds, and SHUTDOWN_MARGIN for what is still open after it: FnstreamRunner)."""
    config = app[CONFIG]
    raise_fd_limit(config.frontend.limits.maxConnections)
    runner = FnstreamRunner(app, config.frontend.limits, grace=config.frontend.args.shutdownGraceSeconds,
                            **SERVER_KWARGS)
    await runner.setup()
    try:  # a listener that cannot start still stops what setup started (a cluster node's tasks)
        await start_site(runner, config, host, port)
        log.info("fnstream listening on http://%s:%d (%d functions, %s loop)", host, port, len(app[REGISTRY]),
                 loop_name(asyncio.get_running_loop()))
        print(f"fnstream listening on http://{host}:{port}", flush=True)
        freeze_startup()  # full collections walk only what serving makes (runtime/heap.py)
        await wait_for_stop_signal()
    finally:
        log.info("shutting down")
        await runner.cleanup()
