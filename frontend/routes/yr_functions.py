"""openYuanrong's function-registration API: `POST /serverless/v1/functions` and GET / PUT /
DELETE `/serverless/v1/functions/{name}` with its JSON (`0@{service}@{func}`, `concurrentNum`
as a string, ...), answered as openYuanrong does: `{"code": 0, "message": "SUCCESS", "function":
{id, functionVersionUrn, revisionId, ...}}`. Deploys go through the admin API's `deploy`
(stored before answered); a function registered so is invoked by its URN. `GET
/serverless/v1/functions` lists the caller's tenant's functions only, in openYuanrong's
`{"code", "message", "result": {"functions", "total"}}` with its `name` / `versionNumber` /
`pageIndex` / `pageSize` query.

Errors carry openYuanrong meta-service's codes (its `function_repo/errmsg/errors.go`): 130600 a body
that is not JSON, 4104 an invalid registration, 4101 a name that exists, 4115 an unknown function,
4134 a stale `revisionId`, 4123 a bad page. The HTTP status stays fnstream's (400 / 404 / 409):
openYuanrong answers 500 for several of them, and its clients (`yrcli`) only tell 200 from the rest.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Awaitable, Callable, Iterator
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
from ..yr_meta import function_info, is_yr_name, manifest_entry, split_name, yr_name
from .deploying import deploy, managed, parse, urn_tenant

__all__ = ("routes",)

routes = web.RouteTableDef()

# openYuanrong meta-service's codes (functionsystem: apps/meta_service/function_repo/errmsg/errors.go)
NAME_EXISTS = 4101  # "the function name already exists. rename your function"
INVALID_PARAM = 4104  # InvalidUserParam: a field is wrong
FUNCTION_NOT_FOUND = 4115  # "function [%s] is not found. check input parameters"
PAGE_INFO = 4123  # PageInfoError
REVISION_ID = 4134  # "revisionID is not the same"
BAD_JSON = 130600  # InvalidParamErrorCode: the body did not decode (meta_service/router/utils.go)
PAGE_SIZE = 1000  # openYuanrong's meta-service default (its chart's function.default.pageSize)

_Handler = Callable[[web.Request], Awaitable[web.Response]]


class _YrError(FunctionServiceError):
    """An error already in openYuanrong's codes: passed on as it is."""


@contextlib.contextmanager
def _codes_of(request: web.Request) -> Iterator[None]:
    """fnstream's errors on these routes -> openYuanrong meta-service's codes, same status and message."""
    try:
        yield
    except _YrError:
        raise
    except FunctionNotFoundError:
        ref = request.match_info.get("name", "")
        raise _YrError(f"function [{ref}] is not found. check input parameters",
                       code=FUNCTION_NOT_FOUND, status=404) from None
    except FunctionServiceError as exc:
        if exc.status == 400:  # a field the registration got wrong (or code that does not load)
            raise _YrError(exc.message, code=INVALID_PARAM, status=400) from None
        raise


def _yr_codes(handler: _Handler) -> _Handler:
    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.Response:
        with _codes_of(request):
            return await handler(request)
    return wrapped


def _ok(dep: Deployment) -> web.Response:
    return web.json_response({"code": 0, "message": "SUCCESS", "function": function_info(dep)})


async def _registration(request: web.Request) -> Any:
    try:
        return await read_json_body(request)
    except BadRequestError as exc:  # not JSON: openYuanrong's decoder error, 130600
        raise _YrError(exc.message, code=BAD_JSON, status=400) from None


async def _specs(request: web.Request, body: Any, name: str | None = None) -> list[FunctionSpec]:
    entry = manifest_entry(body, name)
    specs = await asyncio.to_thread(parse, json.dumps(entry), list(request.app[REGISTRY].code_roots))
    return owned_specs(request, specs)


def _check_version(request: web.Request, dep: Deployment) -> None:
    """`?versionNumber=` (yrcli sends `latest`) must be the deployed one."""
    asked = request.query.get("versionNumber", "")
    if asked and asked != dep.spec.version:
        raise FunctionNotFoundError(f"function {dep.name!r} has no version {asked!r}")


def _named(request: web.Request) -> Deployment:
    """The function `{name}` names (`0@service@func`, its URN, or fnstream's name), if the token may manage it."""
    ref = request.match_info["name"]
    if is_yr_name(ref):
        service, func = split_name(ref)
        parts: dict[str, str | None] = {"name": func, "namespace": service, "tenant": None, "version": None}
    else:
        parts = parse_function_ref(ref)
    dep = managed(request, str(parts["name"]), urn_tenant(request, parts["tenant"]))
    for key in ("namespace", "tenant"):
        if parts[key] is not None and parts[key] != getattr(dep.spec, key):
            raise FunctionNotFoundError(f"function {ref!r} is not registered")
    return dep


def is_registration(body: Any) -> bool:
    """An openYuanrong registration body (its `name` `0@{service}@{func}`), never a fnstream manifest."""
    return isinstance(body, dict) and is_yr_name(body.get("name"))


@routes.post("/serverless/v1/functions")
async def register(request: web.Request) -> web.Response:
    return await register_body(request, await _registration(request))


async def register_body(request: web.Request, body: Any) -> web.Response:
    """Register `body`, read already (here, or by yrcli's `POST /admin/v1/functions`)."""
    with _codes_of(request):
        specs = await _specs(request, body)
        try:
            (dep,) = await deploy(request, specs, replace=False)
        except DeployError as exc:
            if exc.status == 409:
                raise _YrError("the function name already exists. rename your function",
                               code=NAME_EXISTS, status=409) from None
            raise
    return _ok(dep)


def _page_arg(request: web.Request, key: str, default: int) -> int:
    raw = request.query.get(key, "")
    if raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise _YrError(f"query {key!r} must be a positive integer (got {raw!r})", code=PAGE_INFO, status=400)
    return int(raw)


@routes.get("/serverless/v1/functions")
@_yr_codes
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
    # openYuanrong's list answers through its WriteResponse: code 0 and an empty message
    return web.json_response({"code": 0, "message": "",
                              "result": {"functions": [function_info(d) for d in page], "total": len(deps)}})


@routes.get("/serverless/v1/functions/{name}")
@_yr_codes
async def get(request: web.Request) -> web.Response:
    dep = _named(request)
    _check_version(request, dep)
    return _ok(dep)


@routes.put("/serverless/v1/functions/{name}")
@_yr_codes
async def update(request: web.Request) -> web.Response:
    """openYuanrong answers an update `{"code": 0, "message": "", "result": FunctionVersion}` (yrcli
    reads `result`), and refuses a `revisionId` that is not the current one (4134)."""
    current = _named(request)
    body = await _registration(request)
    revision = body.get("revisionId") if isinstance(body, dict) else None
    if revision not in (None, "") and str(revision) != str(current.revision):
        raise _YrError("revisionID is not the same", code=REVISION_ID, status=409)
    specs = await _specs(request, body, f"0@{current.spec.namespace}@{current.name}")
    (dep,) = await deploy(request, specs)
    return web.json_response({"code": 0, "message": "", "result": function_info(dep)})


@routes.delete("/serverless/v1/functions/{name}")
@_yr_codes
async def delete(request: web.Request) -> web.Response:
    """openYuanrong answers a delete with `{}` (meta_service/router/function.go)."""
    named = _named(request)
    _check_version(request, named)
    dep = request.app[REGISTRY].delete(named.key)
    await forget_function(request.app, dep.key)  # [jobs hook]
    return web.json_response({})
