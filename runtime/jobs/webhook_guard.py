"""Which addresses a webhook may reach: public ones only, unless `jobs.webhook.allowPrivate`.

Any user can give a job a webhook URL, and the server POSTs to it: without this guard a token was
enough to make the server call its own routes (publishing to a stream), the cloud's metadata
service or anything on the private network. Refused: loopback, private, link-local, multicast,
unspecified, reserved and every other non-global range, IPv4-mapped IPv6 judged as its IPv4, and
6to4, Teredo and NAT64 addresses refused when the IPv4 they embed is (then judged by range too),
and ranges Python's `is_global` (3.11) takes for public: site-local `fec0::/10`, the IETF protocol
assignments `192.0.0.0/24`, the retired 6to4 relay anycast `192.88.99.0/24`, documentation
`3fff::/20` and SRv6 SIDs `5f00::/16`.

Two checks: at submit, a URL whose host is a literal address (in any form the resolver would
read as one: `127.1`, `2130706433`, `0177.0.0.1`, `127.0.0.1.`, `[::ffff:127.0.0.1]`) is refused with 400; at
delivery, a name is resolved and refused when ANY of its addresses is, and the connection goes
to the addresses that were checked (`GuardedResolver` is the session's resolver), so a name
cannot resolve to a public address for the check and a private one for the connect.
"""
from __future__ import annotations

import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

__all__ = ("WebhookRefused", "GuardedResolver", "literal_address", "refusal")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookRefused(OSError):
    """A webhook destination the guard refuses (an OSError: aiohttp's connector passes it on)."""


def literal_address(host: str) -> Address | None:
    """`host` as the address it literally is (brackets and IPv6 zone allowed, legacy IPv4 forms
    read as inet_aton reads them, a trailing dot too: the resolver reads `127.0.0.1.` as
    127.0.0.1), or None for a name."""
    host = host.strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not host or not all(c in "0123456789abcdefxABCDEFX." for c in host):
        return None  # a name: no inet_aton of "beef.cafe"-like hex is wanted, resolution judges it
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
# Not public, though Python 3.11's is_global says they are (IANA special-purpose registries).
_NOT_GLOBAL: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.IPv6Network("fec0::/10"), "a site-local (deprecated, RFC 3879)"),
    (ipaddress.IPv4Network("192.0.0.0/24"), "an IETF protocol assignment (RFC 6890)"),
    (ipaddress.IPv4Network("192.88.99.0/24"), "a retired 6to4 relay anycast (RFC 7526)"),
    (ipaddress.IPv6Network("3fff::/20"), "a documentation (RFC 9637)"),
    (ipaddress.IPv6Network("5f00::/16"), "an SRv6 SID (RFC 9602)"),
)


def _embedded(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a relay or translator would carry traffic for `address` to: 6to4
    (2002::/16), Teredo (2001::/32: its server and client), NAT64 (RFC 6052/8215 prefixes)."""
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    if any(address in net for net in _NAT64):
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    return []


def refusal(address: Address) -> str | None:
    """Why a webhook may not reach `address` (None: it may)."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is not None:
            address = mapped
        else:
            # Python's is_global judges 6to4 by its prefix alone: 2002:7f00:1:: (127.0.0.1) was "public".
            for inner in _embedded(address):
                reason = refusal(inner)
                if reason is not None:
                    return f"{address} embeds {reason}"
    for kind in ("loopback", "private", "link_local", "multicast", "unspecified", "reserved"):
        if getattr(address, f"is_{kind}"):
            return f"{address} is a {kind.replace('_', '-')} address"
    for network, kind in _NOT_GLOBAL:
        if address.version == network.version and address in network:
            return f"{address} is {kind} address"
    if not address.is_global:
        return f"{address} is not a public address"
    return None


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, answering only for names whose every address is public."""

    def __init__(self) -> None:
        self._inner: AbstractResolver = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = refusal(ipaddress.ip_address(result["host"]))
            if reason is not None:
                raise WebhookRefused(f"webhook host {host!r} resolves to {reason} (jobs.webhook.allowPrivate)")
        return results  # exactly the addresses checked: the connection goes to one of them

    async def close(self) -> None:
        await self._inner.close()
