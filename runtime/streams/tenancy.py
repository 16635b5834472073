"""Named streams belong to a tenant: the broker sees `<tenant>/<name>`, callers see `<name>`.

Names are per tenant: tenant A's `jobs` and tenant B's `jobs` are two streams. The qualified
name is what every broker stores (in cluster mode it is part of the Redis keys), so a caller
can only ever reach the streams of the tenant it is scoped to. A tenant id never contains `/`
(manifest and auth rules), so the first `/` separates tenant and name unambiguously.

In-process handlers are scoped by `current_tenant` (set by the executor for each invocation);
REST callers by their token; process workers by the frontend's StreamBridge, which knows the
worker's function and never trusts a name the worker qualified itself.
"""
from __future__ import annotations

import contextvars

from .names import validate_stream_name

__all__ = ("DEFAULT_TENANT", "current_tenant", "qualify", "unqualify", "tenant_of", "scoped_tenant", "shown")

DEFAULT_TENANT = "default"
SEPARATOR = "/"

#: The tenant of the invocation running in this task or thread (None outside any invocation).
current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("fnstream_tenant", default=None)


def scoped_tenant() -> str:
    """The tenant the handler API acts for: the running invocation's, else the default tenant."""
    return current_tenant.get() or DEFAULT_TENANT


def qualify(tenant: str, name: object) -> str:
    """`<tenant>/<name>` for the broker; the caller's `name` is validated first (400 if bad)."""
    return f"{tenant}{SEPARATOR}{validate_stream_name(name)}"


def tenant_of(qualified: str) -> str:
    return qualified.partition(SEPARATOR)[0]


def unqualify(tenant: str, qualified: str) -> str | None:
    """The caller-facing name of a broker name of `tenant`, or None if it belongs to another."""
    owner, sep, name = qualified.partition(SEPARATOR)
    if not sep or owner != tenant:
        return None
    return name


def shown(qualified: str) -> str:
    """The name its caller knows a broker name by (`<tenant>/<name>` → `<name>`): what messages,
    `Producer.name` and `Consumer.name` say, so no caller ever sees the tenant-qualified form."""
    _owner, sep, name = qualified.partition(SEPARATOR)
    return name if sep else qualified
