"""CORS for browser pages on other origins, and the Origin guard that keeps other sites out.

`frontend.cors.allowOrigins` lists the origins allowed (`*` = any; empty = CORS off, the
default). A preflight `OPTIONS` on any route answers 204 for an allowed origin; every answer to
an allowed origin (JSON, SSE, errors, 401s) carries `Access-Control-Allow-Origin` and
`Vary: Origin`, added as its headers go out.

The guard: a browser sends some cross-site requests without a preflight (a "simple" POST with
`text/plain` or a form type) and would run the function before CORS could refuse to show the
answer. So a request whose `Origin` is neither allowed nor this server's own gets 403 on every
state-changing method and on the admin API, before auth or the route runs. Requests without
`Origin` (curl, SDKs, servers) are not browsers' and pass whatever their content type.
"""
from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web

from runtime.config import CorsConfig
from runtime.errors import ForbiddenError

from .hosts import HOST_POLICY
from .keys import CONFIG

__all__ = ("CorsPolicy", "cors_middleware", "add_cors_headers", "install_cors", "ALLOW_HEADERS", "CORS_POLICY")

# Request headers a cross-origin page may send. `X-Stream-*` is a family: a preflight asking for
# any X-Stream-... header gets it allowed (Access-Control-Allow-Headers has no wildcards with
# credentials, so the names asked for are echoed).
ALLOW_HEADERS = ("Authorization", "Content-Type", "Accept", "Last-Event-ID", "X-Auth", "X-Trace-Id",
                 "X-Invoke-Type", "X-Instance-Session", "X-Timeout-Ms", "X-Expect-Num", "X-Webhook-Url",
                 "traceparent", "tracestate")
_ALLOWED_LOWER = frozenset(h.lower() for h in ALLOW_HEADERS)
_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_ALWAYS_EXPOSED = ("X-Request-Id", "traceparent", "X-Invocation-Id")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class CorsPolicy:
    """Which origins are allowed, and the headers their answers get."""

    def __init__(self, cfg: CorsConfig) -> None:
        self.enabled = bool(cfg.allowOrigins)
        self.any_origin = "*" in cfg.allowOrigins
        self.origins = frozenset(o.rstrip("/").lower() for o in cfg.allowOrigins if o != "*")
        self.credentials = cfg.allowCredentials
        self.max_age = str(cfg.maxAgeSeconds)
        exposed = list(dict.fromkeys([*cfg.exposeHeaders, *_ALWAYS_EXPOSED]))
        self.expose = ", ".join(exposed)

    def allows(self, origin: str) -> bool:
        return self.enabled and (self.any_origin or origin.rstrip("/").lower() in self.origins)

    def origin_headers(self, origin: str) -> dict[str, str]:
        # `*` cannot be combined with credentials: then the origin itself is named.
        value = "*" if self.any_origin and not self.credentials else origin
        headers = {"Access-Control-Allow-Origin": value}
        if self.credentials:
            headers["Access-Control-Allow-Credentials"] = "true"
        return headers


CORS_POLICY = web.AppKey("cors_policy", CorsPolicy)


def _is_own_origin(request: web.Request, origin: str) -> bool:
    """The page was served by this server (or by the proxy in front of it)."""
    netloc = urllib.parse.urlsplit(origin).netloc.lower()
    if not netloc:
        return False  # `Origin: null` (sandboxed frames, file:// pages) is nobody's own
    hosts = {request.host.lower()}
    forwarded = request.app[HOST_POLICY].forwarded_host(request)  # only a frontend.trustedProxies peer's
    if forwarded:
        hosts.add(forwarded.lower())
    return netloc in hosts


def _guarded(request: web.Request) -> bool:
    return request.method not in _SAFE_METHODS or request.path.startswith("/admin/")


def _allowed_request_headers(asked: str) -> str:
    names = [h.strip() for h in asked.split(",") if h.strip()]
    extra = [h for h in names if h.lower().startswith("x-stream-") and h.lower() not in _ALLOWED_LOWER]
    return ", ".join([*ALLOW_HEADERS, *extra])


def _preflight(request: web.Request, policy: CorsPolicy, origin: str) -> web.Response:
    match_error = request.match_info.http_exception
    if isinstance(match_error, web.HTTPNotFound):
        raise match_error  # no such route: nothing to allow
    if isinstance(match_error, web.HTTPMethodNotAllowed):
        methods = set(match_error.allowed_methods)
    else:
        methods = {"GET", "HEAD", "POST", "PUT", "DELETE"}
    headers = {
        **policy.origin_headers(origin),
        "Vary": "Origin",
        "Access-Control-Allow-Methods": ", ".join(sorted(methods | {"OPTIONS"})),
        "Access-Control-Allow-Headers": _allowed_request_headers(
            request.headers.get("Access-Control-Request-Headers", "")),
        "Access-Control-Max-Age": policy.max_age,
    }
    return web.Response(status=204, headers=headers)


@web.middleware
def cors_middleware(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    # Not a coroutine itself: a request without `Origin` (every non-browser client) goes straight
    # to the handler's coroutine, without one more coroutine wrapped around it.
    origin = request.headers.get("Origin")
    if origin is None:
        return handler(request)
    return _cors_checked(request, handler, origin)


async def _cors_checked(request: web.Request, handler: Handler, origin: str) -> web.StreamResponse:
    policy = request.app[CORS_POLICY]
    if policy.allows(origin):
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return _preflight(request, policy, origin)
        return await handler(request)
    if _guarded(request) and not _is_own_origin(request, origin):
        raise ForbiddenError(f"origin {origin[:200]!r} is not allowed to call this route "
                             "(add it to frontend.cors.allowOrigins)")
    return await handler(request)


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the CORS headers of an answer to an allowed origin."""
    origin = request.headers.get("Origin")
    if origin is None:
        return
    policy = request.app[CORS_POLICY]
    if not policy.allows(origin):
        return
    headers = response.headers
    for name, value in policy.origin_headers(origin).items():
        headers.setdefault(name, value)
    vary = headers.get("Vary")
    if vary is None:
        headers["Vary"] = "Origin"
    elif "origin" not in vary.lower():
        headers["Vary"] = f"{vary}, Origin"
    headers.setdefault("Access-Control-Expose-Headers", policy.expose)


def install_cors(app: web.Application) -> None:
    """Keep the policy on the app; answers get CORS headers only when some origin is allowed."""
    policy = CorsPolicy(app[CONFIG].frontend.cors)
    app[CORS_POLICY] = policy
    if policy.enabled:
        app.on_response_prepare.append(add_cors_headers)
