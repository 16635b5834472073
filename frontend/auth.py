"""Bearer-token auth: `Authorization: Bearer <token>`, `X-Auth`, or `?token=` on GET.

Off when no tokens are configured. Roles `user` < `developer` < `admin` (frontend/tenancy.py):
invoke routes need any role; everything else but `/healthz` needs `developer` or `admin`. The
scheme is case-insensitive (RFC 7235); the token must match exactly (a padded one is refused).
Tokens are compared in constant time.
"""
from __future__ import annotations

import hmac

from aiohttp import web

from runtime.config import AuthToken
from runtime.errors import ForbiddenError, UnauthorizedError

from .keys import CONFIG, PRINCIPAL
from .tenancy import ROLE_RANK

__all__ = ("auth_middleware", "required_role", "PRINCIPAL")

_PUBLIC = ("/healthz",)


def required_role(path: str) -> str | None:
    if path in _PUBLIC:
        return None
    if path.startswith("/invocations/") or path.startswith("/v1/"):
        return "user"
    if path.startswith("/serverless/v1/functions/") and path.rstrip("/").endswith("/invocations"):
        return "user"
    return "developer"


def _presented_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value  # exactly: "Bearer  tok" or "Bearer tok " is not "tok"
    if request.headers.get("X-Auth"):
        return request.headers["X-Auth"]
    # A browser EventSource cannot set headers: GET requests may carry `?token=` (as openYuanrong's).
    if request.method == "GET" and request.query.get("token"):
        return request.query["token"]
    return None


def _match(presented: str, tokens: list[AuthToken]) -> AuthToken | None:
    found = None
    given = presented.encode("utf-8", "surrogateescape")  # header bytes that are not UTF-8 arrive as surrogates
    for candidate in tokens:  # no early exit: the time taken does not depend on which token matched
        if hmac.compare_digest(given, candidate.token.encode()):
            found = candidate
    return found


@web.middleware
async def auth_middleware(request: web.Request, handler):
    tokens = request.app[CONFIG].auth.tokens
    role = required_role(request.path)
    if not tokens or role is None:
        return await handler(request)
    presented = _presented_token(request)
    if presented is None:
        raise UnauthorizedError("missing credentials: send 'Authorization: Bearer <token>'")
    principal = _match(presented, tokens)
    if principal is None:
        raise UnauthorizedError("invalid token")
    if ROLE_RANK[principal.role] < ROLE_RANK[role]:
        raise ForbiddenError(f"this route needs the 'developer' (or 'admin') role; the token has {principal.role!r}")
    request[PRINCIPAL] = principal
    return await handler(request)
