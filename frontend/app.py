"""Building the aiohttp application, and running it as a server."""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from runtime.config import Config
from runtime.executor import Executor
from runtime.lifecycle import wait_for_stop_signal
from runtime.manifest import load_deploy_dir
from runtime.registry import Registry
from runtime.streams import AbstractBroker, bind_broker, build_broker, unbind_broker

from .auth import auth_middleware
from .errors import error_middleware
from .keys import BROKER, CONFIG, EXECUTOR, REGISTRY
from .parse_errors import JSONErrorRunner
from .routes import admin, health, invoke, openai, streams

__all__ = ("build_app", "build_registry", "serve", "SERVER_KWARGS")

log = logging.getLogger("fnstream.frontend")


class AccessLogger(AbstractAccessLogger):
    """One line per request, without the query string: `?token=` must not reach the logs."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %d %.1fms", request.remote, request.method, request.path,
                         response.status, time * 1000)


# aiohttp cancels a request's handler when its client disconnects only when asked to; fnstream
# relies on it to cancel invocations of clients that left.
SERVER_KWARGS = {"handler_cancellation": True, "access_log_class": AccessLogger}


def build_registry(config: Config, *, deploy: bool = True) -> Registry:
    """A registry with every manifest of `runtime.deployDir` deployed (all or nothing)."""
    registry = Registry(config.runtime.codeRoots, stop_grace=config.frontend.args.shutdownGraceSeconds)
    if deploy and config.runtime.deployDir is not None:
        registry.deploy(load_deploy_dir(config.runtime.deployDir))
    return registry


def build_app(config: Config, registry: Registry | None = None, executor: Executor | None = None,
              broker: AbstractBroker | None = None) -> web.Application:
    body_limit = int(config.frontend.args.maxRequestBodySize * 1024 * 1024)
    # Without tokens auth is off: no middleware at all rather than one that checks and passes.
    middlewares = [error_middleware, auth_middleware] if config.auth.tokens else [error_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=body_limit)
    app[CONFIG] = config
    app[REGISTRY] = registry if registry is not None else build_registry(config)
    app[EXECUTOR] = executor if executor is not None else Executor(config.runtime.threadPoolSize,
                                                                     config.runtime.threadsPerFunction)
    app[BROKER] = broker if broker is not None else build_broker(config.streams)
    app.add_routes(health.routes)
    app.add_routes(invoke.routes)
    app.add_routes(admin.routes)
    app.add_routes(streams.routes)
    app.add_routes(openai.routes)

    async def _shutdown_executor(app: web.Application):
        app[EXECUTOR].loop_monitor.start()  # logs event-loop stalls (runtime/limits.py)
        yield
        await app[EXECUTOR].loop_monitor.stop()
        # Worker processes: cancelled handlers are reaped, then every pool runs preStop and exits.
        await app[EXECUTOR].process.aclose()
        await app[REGISTRY].stop_workers()
        app[EXECUTOR].shutdown()

    app.cleanup_ctx.append(_shutdown_executor)

    async def _drain_invocations(app: web.Application) -> None:
        # Runs after the listener stopped and before aiohttp waits for open responses: aborted
        # invocations end their SSE responses with an error event and [DONE]. Named-stream
        # subscribers get what producers still send, then `event: end` (reason shutdown) once the
        # invocations are done or shortly before the grace runs out, whichever comes first.
        grace = app[CONFIG].frontend.args.shutdownGraceSeconds
        drain = asyncio.ensure_future(app[EXECUTOR].drain(grace))
        await asyncio.wait([drain], timeout=grace * 0.8)
        await streams.end_subscriptions(app)
        await drain

    app[streams.OPEN_SUBSCRIPTIONS] = set()
    app.on_shutdown.append(_drain_invocations)

    async def _bind_broker(app: web.Application):
        # Handlers reach the broker through runtime.create_stream_producer() & co. (runtime/streams/api.py).
        broker = app[BROKER]
        bind_broker(broker, asyncio.get_running_loop())
        yield
        unbind_broker(broker)
        await broker.close()

    app.cleanup_ctx.append(_bind_broker)
    if config.cluster.redisUrl:  # cluster mode: registry, queue and streams shared through Redis
        from .cluster import attach_cluster
        attach_cluster(app)
    return app


async def serve(app: web.Application, host: str, port: int, *, shutdown_timeout: float = 10.0) -> None:
    """Run until SIGINT/SIGTERM, then stop accepting and give open requests time to finish."""
    runner = JSONErrorRunner(app, shutdown_timeout=shutdown_timeout, **SERVER_KWARGS)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("fnstream listening on http://%s:%d (%d functions)", host, port, len(app[REGISTRY]))
    print(f"fnstream listening on http://{host}:{port}", flush=True)
    try:
        await wait_for_stop_signal()
    finally:
        log.info("shutting down")
        await runner.cleanup()
