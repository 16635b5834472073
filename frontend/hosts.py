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

A Host is read strictly, `host[:port]` (a name of letters, digits, `.-_~`, an IPv4 address or a
bracketed IPv6 one; the port digits, at most 65535): anything else (`127.0.0.1:80@evil.example`,
a second colon, a zone, spaces, `:99999`) is a 400 rather than a guess at which part is the host. An absolute-form
target (`GET http://127.0.0.1/... HTTP/1.1`, RFC 9112 3.2.2) names the host aiohttp serves as the
request's; the guard judges it and the Host header alike, and both must be allowed.
"""
from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from runtime.config import Config
from runtime.errors import BadRequestError, FunctionServiceError, MisdirectedRequestError

__all__ = ("HostPolicy", "HOST_POLICY", "host_middleware", "parse_host")

_WILDCARDS = frozenset(("", "0.0.0.0", "::", "*"))
_DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# host [":" port]: a reg-name of unreserved characters (no pct-encoding or sub-delims: no
# server's name has them) or an IPv4 address, or "[" IPv6 "]"; port = *DIGIT (RFC 9110 7.2), at
# most 65535 (a TCP port).
_HOST_GRAMMAR = re.compile(r"(?:(?P<name>[a-z0-9._~-]+)|\[(?P<v6>[0-9a-f:.]+)\])(?::(?P<port>[0-9]{0,5}))?")


@functools.lru_cache(maxsize=1024)
def parse_host(value: str) -> str | None:
    """The name or address a Host value names (lowercased, no port, brackets or trailing dot), or
    None when it is not `host[:port]`. A bare IPv6 address (as yarl gives an absolute-form
    target's host) is read as itself."""
    if len(value) > 300:
        return None  # a DNS name is at most 253 characters (and this cache's entries stay small)
    value = value.lower()
    match = _HOST_GRAMMAR.fullmatch(value)
    if match is None:
        return _bare_ipv6(value)
    if match["port"] and int(match["port"]) > 65535:
        return None
    if match["v6"] is not None:
        return _bare_ipv6(match["v6"])
    name = match["name"].rstrip(".")
    return name or None


def _bare_ipv6(value: str) -> str | None:
    if ":" not in value or "%" in value:
        return None
    try:
        return str(ipaddress.IPv6Address(value))
    except ValueError:
        return None


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
        # Read as a request's Host is (an entry that is no host[:port], `*` say, names nothing).
        self.names = frozenset(name for name in (parse_host(n.strip()) for n in names) if name is not None)

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
        return self.any or self.refusal(request) is None

    def refusal(self, request: web.BaseRequest) -> FunctionServiceError | None:
        """Why `request` is not served here: 400 for a Host that is not `host[:port]`, 421 for
        one not allowed; None when it is served."""
        forwarded = self.forwarded_host(request)
        if forwarded is not None:
            return self._judge(forwarded, "X-Forwarded-Host")
        header = request.headers.get("Host")
        refused = None if header is None else self._judge(header, "Host")
        if refused is None and request.host != header:  # an absolute-form target: its authority too
            refused = self._judge(request.host, "request target's host")
        return refused

    def _judge(self, value: str, what: str) -> FunctionServiceError | None:
        name = parse_host(value)
        if name is None:
            return BadRequestError(f"{what} {value[:200]!r} is not host[:port]")
        if name in self.names or (self.addresses and _is_address(name)):
            return None
        return MisdirectedRequestError(f"host {name[:200]!r} is not served here (add it to frontend.allowedHosts)")


HOST_POLICY = web.AppKey("host_policy", HostPolicy)


@web.middleware
def host_middleware(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    # Not a coroutine itself: an allowed request goes straight to the handler's coroutine.
    refused = request.app[HOST_POLICY].refusal(request)
    if refused is not None:
        raise refused
    return handler(request)
