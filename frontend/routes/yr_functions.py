"""openYuanrong's function-registration API: `POST /serverless/v1/functions` and GET / PUT /
DELETE `/serverless/v1/functions/{name}` with its JSON (`0@{service}@{func}`, `concurrentNum`
as a string, ...), answered as openYuanrong does: `{"code": 0, "message": "SUCCESS", "function":
{id, functionVersionUrn, revisionId, ...}}`. Deploys go through the admin API's `_deploy`
(stored before answered); a function registered so is invoked by its URN.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from runtime.deployment import Deployment, parse_function_ref
from runtime.errors import DeployError, FunctionNotFoundError, FunctionServiceError
from runtime.manifest import FunctionSpec

from ..body import read_json_body
from ..jobs import forget_function
from ..keys import REGISTRY
from ..tenancy import owned_specs
from ..yr_meta import function_info, manifest_entry, split_name
from .admin import _deploy, _managed, _parse, _urn_tenant

__all__ = ("routes",)

routes = web.RouteTableDef()

NAME_EXISTS = 4101  # openYuanrong: "the function name already exists. rename your function"


def _ok(dep: Deployment) -> web.Response:
    return web.json_response({"code": 0, "message": "SUCCESS", "function": function_info(dep)})


async def _specs(request: web.Request, name: str | None = None) -> list[FunctionSpec]:
    entry = manifest_entry(await read_json_body(request), name)
    specs = await asyncio.to_thread(_parse, json.dumps(entry), list(request.app[REGISTRY].code_roots))
    return owned_specs(request, specs)


def _named(request: web.Request) -> Deployment:
    """The function `{name}` names (`0@service@func`, its URN, or fnstream's name), if the token may manage it."""
    ref = request.match_info["name"]
    if ref.startswith("0@"):
        service, func = split_name(ref)
        parts: dict[str, str | None] = {"name": func, "namespace": service, "tenant": None, "version": None}
    else:
        parts = parse_function_ref(ref)
    dep = _managed(request, str(parts["name"]), _urn_tenant(request, parts["tenant"]))
    for key in ("namespace", "tenant"):
        if parts[key] is not None and parts[key] != getattr(dep.spec, key):
            raise FunctionNotFoundError(f"function {ref!r} is not registered")
    return dep


@routes.post("/serverless/v1/functions")
async def register(request: web.Request) -> web.Response:
    specs = await _specs(request)
    try:
        (dep,) = await _deploy(request, specs, replace=False)
    except DeployError as exc:
        if exc.status == 409:
            raise FunctionServiceError("the function name already exists. rename your function",
                                       code=NAME_EXISTS, status=409) from None
        raise
    return _ok(dep)


@routes.get("/serverless/v1/functions/{name}")
async def get(request: web.Request) -> web.Response:
    return _ok(_named(request))


@routes.put("/serverless/v1/functions/{name}")
async def update(request: web.Request) -> web.Response:
    current = _named(request)
    specs = await _specs(request, f"0@{current.spec.namespace}@{current.name}")
    (dep,) = await _deploy(request, specs)
    return _ok(dep)


@routes.delete("/serverless/v1/functions/{name}")
async def delete(request: web.Request) -> web.Response:
    dep = request.app[REGISTRY].delete(_named(request).key)
    await forget_function(request.app, dep.key)  # [jobs hook]
    body: dict[str, Any] = {"code": 0, "message": "SUCCESS", "function": function_info(dep)}
    return web.json_response(body)
