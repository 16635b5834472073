"""Cluster mode in the HTTP frontend: guard admin changes, show status (the node runs in runtime/node.py).

Admin changes (deploy, redeploy, delete) need Redis so every node gets them: 503 when it is
unreachable, and the change is stored in Redis before the response goes out.
"""
from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from runtime.cluster import ClusterNode

from .auth import principal_of

__all__ = ("CLUSTER", "install_cluster", "cluster_middleware", "routes")

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


def install_cluster(app: web.Application, node: ClusterNode) -> None:
    """The HTTP side of the node's cluster membership (runtime/node.py runs the membership itself)."""
    app.middlewares.append(cluster_middleware)
    app.add_routes(routes)
    app[CLUSTER] = node
