"""Who may act on what: a token's tenant and role decide which functions and streams it reaches.

Roles, weakest first: `user` (invoke), `developer` (also manage functions and streams of its own
tenant), `admin` (manage every tenant's functions and streams). Invoking stays within the
token's own tenant for every role. With auth off (no tokens) there is no boundary.
"""
from __future__ import annotations

import re

from aiohttp import web

from runtime.config import AuthToken
from runtime.errors import BadRequestError, ForbiddenError
from runtime.manifest import FunctionSpec
from runtime.streams.tenancy import DEFAULT_TENANT

from .keys import CONFIG, PRINCIPAL

__all__ = ("ROLE_RANK", "principal_of", "check_manage", "owned_specs", "stream_tenant", "may_see")

ROLE_RANK = {"user": 0, "developer": 1, "admin": 2}
TENANT_HEADER = "X-Tenant-ID"
_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")  # as a manifest's `tenant`


def principal_of(request: web.Request) -> AuthToken | None:
    """The request's token, or None when auth is off."""
    if not request.app[CONFIG].auth.tokens:
        return None
    return request.get(PRINCIPAL)


def may_see(request: web.Request, tenant: str) -> bool:
    principal = principal_of(request)
    return principal is None or principal.role == "admin" or principal.tenant == tenant


def check_manage(request: web.Request, tenant: str, what: str) -> None:
    """403 unless the token belongs to `tenant` or has the `admin` role."""
    if not may_see(request, tenant):
        principal = principal_of(request)
        assert principal is not None
        raise ForbiddenError(f"a {principal.role!r} token of tenant {principal.tenant!r} may not manage "
                             f"{what} of tenant {tenant!r} (that needs the 'admin' role)")


def owned_specs(request: web.Request, specs: list[FunctionSpec]) -> list[FunctionSpec]:
    """Specs with no `tenant` field get the token's tenant; any other tenant needs `admin` (403)."""
    principal = principal_of(request)
    out = []
    for spec in specs:
        if principal is not None and "tenant" not in spec.model_fields_set:
            spec = spec.model_copy(update={"tenant": principal.tenant})
        check_manage(request, spec.tenant, f"function {spec.name!r}")
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
    check_manage(request, asked, "streams")
    return asked
