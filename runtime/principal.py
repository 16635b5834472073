"""Who asks: a `Principal` (tenant, role), resolved once per request and handed to the runtime.

A leaf module, so every layer that names something (registry, streams, dispatch, jobs) can take
a principal and check it without importing the layers above it. None means auth is off.

The tenant rules live here, once. Roles, weakest first: `user` (invoke), `developer` (also
manage the functions and streams of its own tenant), `admin` (manage every tenant's functions
and streams). Running a function stays within the principal's own tenant for every role.
Function names belong to their tenant: a lookup is made within one tenant, so another tenant's
function is an unknown name (404), never a 403 that would confirm it exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ForbiddenError, FunctionNotFoundError

if TYPE_CHECKING:
    from .manifest import FunctionSpec

__all__ = ("Principal", "ROLE_RANK", "check_tenant", "may_manage", "check_manage")

ROLE_RANK = {"user": 0, "developer": 1, "admin": 2}


@dataclass(frozen=True, slots=True)
class Principal:
    """The tenant a request acts for and its role (`user`, `developer` or `admin`)."""

    tenant: str
    role: str


def check_tenant(principal: Principal | None, spec: FunctionSpec) -> None:
    """404 unless `principal` belongs to the function's tenant (None: auth is off, anyone may).

    No role crosses this one: an `admin` manages other tenants' functions but never runs them. The
    answer is an unknown name's, word for word: another tenant's names are not this one's business.
    """
    if principal is not None and principal.tenant != spec.tenant:
        raise FunctionNotFoundError(f"function {spec.name!r} is not deployed")


def may_manage(principal: Principal | None, tenant: str) -> bool:
    """Whether `principal` may see and change what `tenant` owns: its own tenant, or the `admin` role."""
    return principal is None or principal.role == "admin" or principal.tenant == tenant


def check_manage(principal: Principal | None, tenant: str, what: str) -> None:
    """403 unless `principal` may manage `what` of `tenant` (see `may_manage`)."""
    if principal is not None and not may_manage(principal, tenant):
        raise ForbiddenError(f"a {principal.role!r} token of tenant {principal.tenant!r} may not manage "
                             f"{what} of tenant {tenant!r} (that needs the 'admin' role)")
