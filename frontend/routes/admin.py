"""Admin API: deploy, redeploy, list, show and delete function services.

`POST /admin/v1/functions` takes a manifest (YAML or JSON; one function or a list) of new
functions; `PUT /admin/v1/functions` deploys or redeploys the functions of one. Relative
`codePath`s in a posted manifest are resolved against the first configured code root.
Names are per tenant (the token's; an `admin` picks another with `X-Tenant-ID`): another
tenant's function of the same name is neither a conflict nor visible, and is a 404 like any
name the tenant has not deployed.

openYuanrong's tools (`yrcli deploy`, ...) send its registration JSON here too, as its frontend
forwards `/admin/v1/functions` to its meta-service: a body whose `name` is `0@{service}@{func}`, and
a `{name}` of that form, are served by the registration API (routes/yr_functions.py), in its shapes.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from runtime.deployment import Deployment
from runtime.errors import BadRequestError
from runtime.manifest import FunctionSpec
from runtime.principal import may_manage

from ..auth import principal_of
from ..body import max_body_values, parse_json_body, read_body
from ..jobs import forget_function
from ..keys import REGISTRY
from ..tenancy import TENANT_HEADER, function_tenant, owned_specs
from ..yr_meta import function_info, is_yr_name
from .deploying import deploy, managed, parse
from .yr_functions import delete as yr_delete
from .yr_functions import get as yr_get
from .yr_functions import is_registration, register_body
from .yr_functions import update as yr_update

__all__ = ("routes",)

routes = web.RouteTableDef()


async def _specs_from_body(request: web.Request, raw: bytes | None = None) -> list[FunctionSpec]:
    raw = await read_body(request) if raw is None else raw
    if not raw.strip():
        raise BadRequestError("empty body: send a manifest (YAML or JSON)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequestError("manifest body is not UTF-8") from None
    # Off the loop: YAML parsing, the working directory and resolving code paths touch the file system.
    specs = await asyncio.to_thread(parse, text, list(request.app[REGISTRY].code_roots))
    return owned_specs(request, specs)  # the token's tenant unless it names another (admin only)


def _deployed(deps: Iterable[Deployment]) -> dict[str, Any]:
    functions = [d.describe() for d in deps]
    return {"code": 0, "message": "SUCCESS", "function": functions[0], "functions": functions}


def _yr_name(request: web.Request) -> bool:
    return is_yr_name(request.match_info["name"])


def _yr_body(raw: bytes, max_values: int) -> Any:
    """The openYuanrong registration `raw` is, or None (a fnstream manifest, YAML or JSON)."""
    if not raw.lstrip().startswith(b"{"):
        return None
    try:
        body = parse_json_body(raw, max_values)
    except BadRequestError:
        return None  # the manifest parser says what is wrong
    return body if is_registration(body) else None


@routes.post("/admin/v1/functions")
async def create_functions(request: web.Request) -> web.Response:
    raw = await read_body(request)
    registration = _yr_body(raw, max_body_values(request.app))
    if registration is not None:  # yrcli deploy: answered as openYuanrong's meta-service answers
        return await register_body(request, registration)
    specs = await _specs_from_body(request, raw)
    deps = await deploy(request, specs, replace=False)
    return web.json_response(_deployed(deps), status=201)


@routes.put("/admin/v1/functions")
async def deploy_functions(request: web.Request) -> web.Response:
    """Deploy or redeploy every function of the manifest: all of them or none (`fnstream deploy`)."""
    specs = await _specs_from_body(request)  # each in its tenant: another tenant's of that name is its own
    deps = await deploy(request, specs)
    return web.json_response(_deployed(deps), status=200)


@routes.get("/admin/v1/functions")
async def list_functions(request: web.Request) -> web.Response:
    principal = principal_of(request)
    only = function_tenant(request) if TENANT_HEADER in request.headers else None
    deps = [d for d in request.app[REGISTRY].list()
            if may_manage(principal, d.spec.tenant) and only in (None, d.spec.tenant)]
    # fnstream's `functions`; openYuanrong's `code` / `message` / `result` for yrcli's list
    return web.json_response({"functions": [d.describe() for d in deps], "code": 0, "message": "",
                              "result": {"functions": [function_info(d) for d in deps], "total": len(deps)}})


@routes.get("/admin/v1/functions/{name}")
async def get_function(request: web.Request) -> web.StreamResponse:
    if _yr_name(request):
        return await yr_get(request)
    return web.json_response({"function": managed(request, request.match_info["name"]).describe()})


@routes.put("/admin/v1/functions/{name}")
async def redeploy_function(request: web.Request) -> web.StreamResponse:
    if _yr_name(request):
        return await yr_update(request)
    name = request.match_info["name"]
    specs = await _specs_from_body(request)
    if len(specs) != 1 or specs[0].name != name:
        raise BadRequestError(f"PUT /admin/v1/functions/{name} takes exactly one function named {name!r}")
    spec = specs[0]
    # 404 when the tenant has nothing of that name to redeploy (another tenant's of that name included).
    dep = managed(request, name, spec.tenant if "tenant" in spec.model_fields_set else None)
    if dep.spec.tenant != spec.tenant:  # auth off, no tenant given: the one found keeps its tenant
        spec = spec.model_copy(update={"tenant": dep.spec.tenant})
    deps = await deploy(request, [spec])
    return web.json_response(_deployed(deps), status=200)


@routes.delete("/admin/v1/functions/{name}")
async def delete_function(request: web.Request) -> web.StreamResponse:
    if _yr_name(request):
        return await yr_delete(request)
    name = request.match_info["name"]
    dep = request.app[REGISTRY].delete(managed(request, name).key)
    await forget_function(request.app, dep.key)  # [jobs hook]
    return web.json_response({"code": 0, "message": "deleted", "function": dep.spec.public()})
