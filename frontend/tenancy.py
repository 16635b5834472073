"""A request's tenant scope: which tenant a posted manifest or a named-stream request acts on.

The rules themselves (roles, who may manage which tenant) are runtime/principal.py's; this
module only reads what HTTP carries: the manifest's `tenant` field and the `X-Tenant-ID` header.
With auth off (no tokens) there is no boundary.
"""
from __future__ import annotations

import re

from aiohttp import web

from runtime.errors import BadRequestError
from runtime.manifest import FunctionSpec
from runtime.principal import check_manage
from runtime.streams.tenancy import DEFAULT_TENANT

from .auth import principal_of

__all__ = ("owned_specs", "stream_tenant", "TENANT_HEADER")

TENANT_HEADER = "X-Tenant-ID"
_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")  # as a manifest's `tenant`


def owned_specs(request: web.Request, specs: list[FunctionSpec]) -> list[FunctionSpec]:
    """Specs with no `tenant` field get the token's tenant; any other tenant needs `admin` (403)."""
    principal = principal_of(request)
    out = []
    for spec in specs:
        if principal is not None and "tenant" not in spec.model_fields_set:
            spec = spec.model_copy(update={"tenant": principal.tenant})
        check_manage(principal, spec.tenant, f"function {spec.name!r}")
        out.append(spec)
    return out


def stream_tenant(request: web.Request) -> str:
    """The tenant whose named streams a REST request acts on: the token's, or the one named by
    `X-Tenant-ID` (`admin` tokens, or anyone when auth is off)."""
    principal = principal_of(request)
    asked = request.headers.get(TENANT_HEADER)
    if asked is None:
        return principal.tenant if principal is not None else DEFAULT_TENANT
    if not _TENANT_RE.fullmatch(asked):
        raise BadRequestError(f"header {TENANT_HEADER} must be a tenant id (letters, digits, '_' and '-', "
                              f"at most 63), got {asked[:40]!r}")
    check_manage(principal, asked, "streams")
    return asked
