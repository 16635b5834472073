"""A request's tenant scope: which tenant a posted manifest or a named-stream request acts on.

The rules themselves (roles, who may manage which tenant) are runtime/principal.py's; this
module only reads what HTTP carries: the manifest's `tenant` field and the `X-Tenant-ID` header.
Function names are per tenant: an admin route looks a name up in one tenant (the token's, or
the one `X-Tenant-ID` names). With auth off (no tokens) there is no boundary.
"""
from __future__ import annotations

import re

from aiohttp import web

from runtime.errors import BadRequestError
from runtime.manifest import FunctionSpec
from runtime.principal import Principal, check_manage
from runtime.streams.tenancy import DEFAULT_TENANT

from .auth import principal_of

__all__ = ("owned_specs", "function_tenant", "stream_tenant", "TENANT_HEADER")

TENANT_HEADER = "X-Tenant-ID"
_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")  # as a manifest's `tenant`


def owned_specs(request: web.Request, specs: list[FunctionSpec]) -> list[FunctionSpec]:
    """Specs with no `tenant` field get the `X-Tenant-ID` or the token's tenant; any other tenant
    needs `admin` (403)."""
    principal = principal_of(request)
    chosen = function_tenant(request)
    out = []
    for spec in specs:
        if chosen is not None and "tenant" not in spec.model_fields_set:
            spec = spec.model_copy(update={"tenant": chosen})
        check_manage(principal, spec.tenant, f"function {spec.name!r}")
        out.append(spec)
    return out


def function_tenant(request: web.Request) -> str | None:
    """The tenant whose functions an admin request names: `X-Tenant-ID` (an `admin` token's
    choice, or anyone's with auth off), else the token's. None: auth off and no header, so a
    bare name is looked up as the registry does for anyone (runtime/registry.py `get`)."""
    principal = principal_of(request)
    asked = request.headers.get(TENANT_HEADER)
    if asked is None:
        return None if principal is None else principal.tenant
    return _asked_tenant(principal, asked, "functions")


def stream_tenant(request: web.Request) -> str:
    """The tenant whose named streams a REST request acts on: the token's, or the one named by
    `X-Tenant-ID` (`admin` tokens, or anyone when auth is off)."""
    principal = principal_of(request)
    asked = request.headers.get(TENANT_HEADER)
    if asked is None:
        return principal.tenant if principal is not None else DEFAULT_TENANT
    return _asked_tenant(principal, asked, "streams")


def _asked_tenant(principal: Principal | None, asked: str, what: str) -> str:
    if not _TENANT_RE.fullmatch(asked):
        raise BadRequestError(f"header {TENANT_HEADER} must be a tenant id (letters, digits, '_' and '-', "
                              f"at most 63), got {asked[:40]!r}")
    check_manage(principal, asked, what)
    return asked
