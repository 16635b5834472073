"""Cluster mode in the HTTP frontend: start the node with the app, guard admin changes, show status.

Admin changes (deploy, redeploy, delete) need Redis so every node gets them: 503 when it is
unreachable, and the change is stored in Redis before the response goes out.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from runtime.cluster import ClusterNode
from runtime.cluster.invocation_cancels import InvocationCancels
from runtime.tasks import stop_tasks

from .auth import principal_of
from .keys import BROKER, DISPATCHER, EXECUTOR, LIFECYCLE, OUTPUTS, REGISTRY

__all__ = ("CLUSTER", "attach_cluster", "cluster_middleware", "routes")

CLUSTER = web.AppKey("cluster", ClusterNode)
routes = web.RouteTableDef()


@web.middleware
async def cluster_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    node = request.app.get(CLUSTER)
    writes = request.method in ("POST", "PUT", "DELETE") and request.path.startswith("/admin/v1/functions")
    if node is None or not writes:
        return await handler(request)
    await node.require()
    response = await handler(request)
    await node.sync.flush()
    return response


@routes.get("/cluster/v1/status")
async def cluster_status(request: web.Request) -> web.Response:
    node = request.app.get(CLUSTER)
    if node is None:
        return web.json_response({"cluster": False})
    return web.json_response({"cluster": True, **node.status(principal_of(request))})  # own tenant's only


def attach_cluster(app: web.Application) -> None:
    """Run a ClusterNode for the app's lifetime (the registry and executor must already be set)."""
    from .keys import CONFIG

    app.middlewares.append(cluster_middleware)
    app.add_routes(routes)

    node = ClusterNode(app[CONFIG], app[REGISTRY], app[EXECUTOR])
    app[CLUSTER] = node
    app[BROKER] = node.broker   # named streams in Redis: every node sees every stream
    app[DISPATCHER].cluster = node   # functions found and run here or queued for the cluster's workers
    app[LIFECYCLE].stop_intake.append(node.stop_taking)

    outputs = app[OUTPUTS]
    cancels = InvocationCancels(node.redis, node.keys, outputs.cancel_here)
    outputs.send_cancel = cancels.send

    async def _node(app: web.Application) -> AsyncIterator[None]:
        await node.start()
        listener = asyncio.create_task(cancels.listen(), name="cluster-invocation-cancels")
        yield
        await stop_tasks((listener,), "invocation cancels")
        await node.stop()

    app.cleanup_ctx.append(_node)
