"""Bearer-token auth: `Authorization: Bearer <token>`, `X-Auth`, or `?token=` on GET.

Off when no tokens are configured. Roles `user` < `developer` < `admin` (runtime/principal.py):
invoke routes need any role; everything else but `/healthz` needs `developer` or `admin`. The
scheme is case-insensitive (RFC 7235); the token must match exactly (a padded one is refused).
Tokens are compared in constant time.
"""
from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler

from runtime.config import AuthToken
from runtime.errors import ForbiddenError, UnauthorizedError
from runtime.principal import ROLE_RANK, Principal

from .keys import CONFIG, PRINCIPAL

__all__ = ("auth_middleware", "authenticate", "required_role", "principal_of", "PRINCIPAL")

# The console's static files and the API description hold no secrets: the console asks for a
# token and sends it with every API call it makes.
_PUBLIC = ("/healthz", "/", "/openapi.json")
_PUBLIC_PREFIXES = ("/console/",)


def required_role(path: str) -> str | None:
    if path in _PUBLIC or path.startswith(_PUBLIC_PREFIXES) or path == "/console":
        return None
    if path.startswith("/invocations/") or path.startswith("/v1/"):
        return "user"
    if path.startswith(("/v2/", "/serverless/v1/jobs", "/serverless/v1/functions/async-results/",
                        "/serverless/v1/invocations/")):
        return "user"  # [jobs] jobs are invocations: a user token sees its own tenant's
    if path.startswith("/serverless/v1/functions/") and (path.rstrip("/").endswith("/invocations")
                                                         or "/sessions/" in path):
        return "user"  # invoking, and interrupting or ending one's own X-Instance-Session
    return "developer"


def _presented_token(request: web.BaseRequest) -> str | None:
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


def principal_of(request: web.Request) -> Principal | None:
    """Who sent `request`, for the runtime's tenant checks; None when auth is off (anyone may)."""
    if not request.app[CONFIG].auth.tokens:
        return None  # no token was checked (and request.get would raise and catch KeyError)
    token = request.get(PRINCIPAL)
    return None if token is None else Principal(token.tenant, token.role)


def authenticate(request: web.BaseRequest, tokens: list[AuthToken], role: str) -> AuthToken:
    """The token `request` presents, if it is one of `tokens` with at least `role`; 401 / 403."""
    presented = _presented_token(request)
    if presented is None:
        raise UnauthorizedError("missing credentials: send 'Authorization: Bearer <token>'")
    principal = _match(presented, tokens)
    if principal is None:
        raise UnauthorizedError("invalid token")
    if ROLE_RANK[principal.role] < ROLE_RANK[role]:
        raise ForbiddenError(f"this route needs the 'developer' (or 'admin') role; the token has {principal.role!r}")
    return principal


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    tokens = request.app[CONFIG].auth.tokens
    role = required_role(request.path)
    if role == "developer" and request.path == "/metrics" and request.app[CONFIG].metrics.public:
        role = None  # metrics.public: true lets a Prometheus without a token scrape
    if not tokens or role is None:
        return await handler(request)
    request[PRINCIPAL] = authenticate(request, tokens, role)
    return await handler(request)
