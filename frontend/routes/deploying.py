"""What the deploying routes share: parse a posted manifest, find a deployment the token may
manage, deploy and record. The admin API (routes/admin.py) and openYuanrong's registration API
(routes/yr_functions.py) both build on it, so neither imports the other's internals."""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

from runtime.deployment import Deployment, parse_function_ref
from runtime.manifest import FunctionSpec, parse_manifest
from runtime.principal import check_manage, may_manage

from ..auth import principal_of
from ..jobs import remember_functions
from ..keys import REGISTRY
from ..tenancy import TENANT_HEADER, function_tenant

__all__ = ("deploy", "managed", "parse", "urn_tenant")


def parse(text: str, code_roots: list[Path]) -> list[FunctionSpec]:
    """Parse a posted manifest against the first code root, else the working directory (a system call)."""
    return parse_manifest(text, "request body", code_roots[0] if code_roots else Path.cwd())


def managed(request: web.Request, name: str, tenant: str | None = None) -> Deployment:
    """The deployment `name` (a name or URN) names in the request's tenant (`function_tenant`, or
    `tenant`): 404 for another tenant's, as for a name nobody deployed. A URN's tenant counts when
    the token may manage it (an `admin`'s console names other tenants' functions by URN)."""
    principal = principal_of(request)
    tenant = tenant or urn_tenant(request, parse_function_ref(name)["tenant"])
    dep = request.app[REGISTRY].get(name, tenant or function_tenant(request))
    check_manage(principal, dep.spec.tenant, f"function {name!r}")
    return dep


def urn_tenant(request: web.Request, asked: str | None) -> str | None:
    """The tenant a URN names, when the token may manage it and no `X-Tenant-ID` says otherwise."""
    if asked is None or TENANT_HEADER in request.headers or not may_manage(principal_of(request), asked):
        return None
    return asked


async def deploy(request: web.Request, specs: list[FunctionSpec], *, replace: bool = True) -> list[Deployment]:
    """Deploy `specs` and store them (they come back after a restart) before any answer goes out:
    every route that deploys comes through here, so none can leave a deploy unrecorded."""
    deps = await request.app[REGISTRY].adeploy(specs, replace=replace)
    await remember_functions(request.app, deps)  # [jobs hook]
    return deps
