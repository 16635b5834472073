"""openYuanrong's function-registration API: `POST /serverless/v1/functions` and GET / PUT /
DELETE `/serverless/v1/functions/{name}` with its JSON (`0@{service}@{func}`, `concurrentNum`
as a string, ...), answered as openYuanrong does: `{"code": 0, "message": "SUCCESS", "function":
{id, functionVersionUrn, revisionId, ...}}`. Deploys go through the admin API's `_deploy`
(stored before answered); a function registered so is invoked by its URN. `GET
/serverless/v1/functions` lists the caller's tenant's functions only, in openYuanrong's
`{"code", "message", "result": {"functions", "total"}}` with its `name` / `versionNumber` /
`pageIndex` / `pageSize` query.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from runtime.deployment import Deployment, parse_function_ref
from runtime.errors import BadRequestError, DeployError, FunctionNotFoundError, FunctionServiceError
from runtime.manifest import FunctionSpec
from runtime.principal import check_manage

from ..auth import principal_of
from ..body import read_json_body
from ..jobs import forget_function
from ..keys import REGISTRY
from ..tenancy import function_tenant, owned_specs
from ..yr_meta import function_info, manifest_entry, split_name, yr_name
from .admin import _deploy, _managed, _parse, _urn_tenant

__all__ = ("routes",)

routes = web.RouteTableDef()

NAME_EXISTS = 4101  # openYuanrong: "the function name already exists. rename your function"
PAGE_SIZE = 1000  # openYuanrong's meta-service default (its chart's function.default.pageSize)


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


def _page_arg(request: web.Request, key: str, default: int) -> int:
    raw = request.query.get(key, "")
    if raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise BadRequestError(f"query {key!r} must be a positive integer (got {raw!r})")
    return int(raw)


@routes.get("/serverless/v1/functions")
async def list_functions(request: web.Request) -> web.Response:
    """The caller's tenant's functions (never another's, not even for an admin without `X-Tenant-ID`);
    `name` matches part of `0@{service}@{func}`, `versionNumber` exactly, as openYuanrong's does."""
    index, size = _page_arg(request, "pageIndex", 1), _page_arg(request, "pageSize", PAGE_SIZE)
    tenant = function_tenant(request)  # None only with auth off and no X-Tenant-ID: anyone sees all
    if tenant is not None:
        check_manage(principal_of(request), tenant, "functions")
    part, version = request.query.get("name", ""), request.query.get("versionNumber", "")
    deps = sorted((d for d in request.app[REGISTRY].list()
                   if tenant in (None, d.spec.tenant) and part in yr_name(d)
                   and version in ("", d.spec.version)), key=lambda d: (d.spec.tenant, yr_name(d)))
    page = deps[(index - 1) * size:index * size]
    return web.json_response({"code": 0, "message": "SUCCESS",
                              "result": {"functions": [function_info(d) for d in page], "total": len(deps)}})


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
