"""The Host guard against DNS rebinding, and which proxies' X-Forwarded-* headers are believed.

A page on evil.example can re-point its own name at 127.0.0.1 (or a private address) and then
call this server as same-origin: the browser sends `Host: evil.example:PORT` and
`Origin: http://evil.example:PORT`, which the Origin guard takes for the server's own. With auth
off (the default) that invoked, listed and deleted functions. So a request whose Host (or, from
a `frontend.trustedProxies` address, X-Forwarded-Host) is not allowed gets 421 before anything
else runs, on the app path and on the fast lane (frontend/front_door.py) alike.

`frontend.allowedHosts` unset: `localhost`, the listening host and any IP-address literal (a
rebinding page cannot name one: its origin would then be that address, not its own). Bound to a
wildcard (`0.0.0.0`, `::`) the server's names are unknown: with auth on any Host passes (a
rebinding page has no token), with auth off only those. `["*"]` turns the guard off.
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web

from runtime.config import Config
from runtime.errors import MisdirectedRequestError

__all__ = ("HostPolicy", "HOST_POLICY", "host_middleware", "host_name")

_WILDCARDS = frozenset(("", "0.0.0.0", "::", "*"))
_DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def host_name(host: str) -> str:
    """The name or address of a Host header value, without port, brackets or trailing dot, lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


@functools.lru_cache(maxsize=1024)
def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """Which Host values are this server's, and which peers may name another (X-Forwarded-Host)."""

    def __init__(self, config: Config) -> None:
        frontend = config.frontend
        self.proxies = tuple(ipaddress.ip_network(p, strict=False) for p in frontend.trustedProxies)
        if frontend.allowedHosts is None:
            wildcard = frontend.host in _WILDCARDS
            self.any = wildcard and bool(config.auth.tokens)
            self.addresses = True
            names = [*_DEFAULT_NAMES, *(() if wildcard else (frontend.host,))]
        else:
            self.any = "*" in frontend.allowedHosts
            self.addresses = False
            names = list(frontend.allowedHosts)
        self.names = frozenset(host_name(n) for n in names)

    def trusts(self, remote: str | None) -> bool:
        """`remote` (a peer address) is a trusted proxy: its X-Forwarded-* headers are believed."""
        if not self.proxies or not remote:
            return False
        try:
            address = ipaddress.ip_address(remote)
        except ValueError:
            return False
        return any(address in net for net in self.proxies)

    def forwarded_host(self, request: web.BaseRequest) -> str | None:
        """The client's Host as a trusted proxy forwarded it (first X-Forwarded-Host), else None."""
        value = request.headers.get("X-Forwarded-Host")
        if value is None or not self.trusts(request.remote):
            return None
        return value.split(",")[0].strip()

    def allows(self, request: web.BaseRequest) -> bool:
        if self.any:
            return True
        host = self.forwarded_host(request) or request.host
        name = host_name(host)
        return name in self.names or (self.addresses and _is_address(name))

    def refusal(self, request: web.BaseRequest) -> MisdirectedRequestError:
        return MisdirectedRequestError(f"host {host_name(request.host)[:200]!r} is not served here "
                                       "(add it to frontend.allowedHosts)")


HOST_POLICY = web.AppKey("host_policy", HostPolicy)


@web.middleware
def host_middleware(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    # Not a coroutine itself: an allowed request goes straight to the handler's coroutine.
    policy = request.app[HOST_POLICY]
    if not policy.allows(request):
        raise policy.refusal(request)
    return handler(request)
