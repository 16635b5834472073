"""Who asks: a `Principal` (tenant, role), resolved once per request and handed to the runtime.

A leaf module, so every layer that names something (registry, streams, dispatch, jobs) can take
a principal and check it without importing the layers above it. None means auth is off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ForbiddenError

if TYPE_CHECKING:
    from .manifest import FunctionSpec

__all__ = ("Principal", "check_tenant")


@dataclass(frozen=True, slots=True)
class Principal:
    """The tenant a request acts for and its role (`user` or `developer`)."""

    tenant: str
    role: str


def check_tenant(principal: Principal | None, spec: FunctionSpec) -> None:
    """403 unless `principal` belongs to the function's tenant (None: auth is off, anyone may)."""
    if principal is not None and principal.tenant != spec.tenant:
        raise ForbiddenError(f"tenant {principal.tenant!r} may not use function {spec.name!r} "
                             f"of tenant {spec.tenant!r}")
