"""The webhook guard's decisions (runtime/jobs/webhook_guard.py), on literal addresses and on
names: no connection is made to any address here."""
from __future__ import annotations

import ipaddress
import socket

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from runtime.config import WebhookConfig
from runtime.jobs.errors import JobBadRequestError
from runtime.jobs.webhook_guard import GuardedResolver, WebhookRefused, literal_address, refusal
from runtime.jobs.webhooks import WebhookSender

REFUSED = ["127.0.0.1", "127.1", "2130706433", "0177.0.0.1", "0x7f.0.0.1", "0.0.0.0", "0", "10.1.2.3",
           "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "224.0.0.1", "240.0.0.1",
           "255.255.255.255", "::1", "::", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",
           "fe80::1", "fe80::1%eth0", "fc00::1", "fd12::1", "ff02::1", "[::1]", "[::ffff:127.0.0.1]",
           # is_global (Python 3.11) calls these public; a trailing dot is still the address
           "fec0::1", "feff::1", "192.0.0.8", "192.0.0.9", "192.88.99.1", "3fff::1", "5f00::1", "::ffff:192.0.0.8",
           "127.0.0.1.", "10.0.0.1.", "127.1.", "0x7f000001."]
PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "8.8.8.8.", "192.0.1.1",
          "192.175.48.1"]
# IPv6 forms a relay or translator turns into an IPv4 destination: judged by the IPv4 they embed.
EMBEDDED = {"2002:7f00:1::": "127.0.0.1", "2002:a00:1::": "10.0.0.1", "2002:a9fe:a9fe::1": "169.254.169.254",
            "2002:c0a8:101::": "192.168.1.1", "2001:0:7f00:1::": "127.0.0.1",
            "2001:0:808:808:0:0:f5ff:fffe": "10.0.0.1",  # Teredo: public server, client ~0xf5fffffe
            "64:ff9b::7f00:1": "127.0.0.1", "64:ff9b::a00:1": "10.0.0.1", "64:ff9b:1::a9fe:a9fe": "169.254.169.254"}


@pytest.mark.parametrize("host", sorted(EMBEDDED))
def test_6to4_teredo_and_nat64_embedding_a_non_public_ipv4_are_refused(host):
    address = literal_address(host)
    assert address is not None
    reason = refusal(address)
    assert reason is not None and EMBEDDED[host] in reason
    with pytest.raises(JobBadRequestError, match="allowPrivate"):
        WebhookSender(WebhookConfig()).check_url(f"http://[{host}]/x")


def test_6to4_of_a_public_ipv4_passes():
    assert refusal(ipaddress.ip_address("2002:808:808::1")) is None  # 8.8.8.8


@pytest.mark.parametrize("host", REFUSED)
def test_non_public_literals_are_refused(host):
    address = literal_address(host)
    assert address is not None and refusal(address) is not None
    with pytest.raises(JobBadRequestError, match="allowPrivate"):
        netloc = host if ":" not in host or host[0] == "[" else f"[{host}]"
        WebhookSender(WebhookConfig()).check_url(f"http://{netloc}/x")


@pytest.mark.parametrize("host", PUBLIC)
def test_public_literals_pass(host):
    address = literal_address(host)
    assert address is not None and refusal(address) is None


def test_names_are_not_literals_and_allow_private_allows():
    for name in ("localhost", "example.com", "beef.cafe.example", "deadbeef"):
        assert literal_address(name) is None
    assert WebhookSender(WebhookConfig()).check_url("http://localhost:1/x") == "http://localhost:1/x"
    sender = WebhookSender(WebhookConfig(allowPrivate=True))
    assert sender.check_url("http://127.0.0.1:1/x") == "http://127.0.0.1:1/x"


class _Fixed(AbstractResolver):
    """Answers every name with the given addresses."""

    def __init__(self, *hosts: str) -> None:
        self.hosts = hosts

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [{"hostname": host, "host": h, "port": port, "family": socket.AF_INET6 if ":" in h else socket.AF_INET,
                 "proto": 0, "flags": 0} for h in self.hosts]

    async def close(self) -> None:
        pass


async def test_a_name_resolving_to_loopback_is_refused():
    resolver = GuardedResolver()  # the system's resolver: localhost is 127.0.0.1 and/or ::1
    try:
        with pytest.raises(WebhookRefused, match="loopback"):
            await resolver.resolve("localhost", 80)
    finally:
        await resolver.close()


async def test_every_address_of_a_name_is_checked_and_only_they_are_returned():
    resolver = GuardedResolver()
    await resolver.close()
    resolver._inner = _Fixed("93.184.216.34", "10.0.0.7")
    with pytest.raises(WebhookRefused, match=r"10\.0\.0\.7 is a private address"):
        await resolver.resolve("rebind.example", 80)
    resolver._inner = _Fixed("93.184.216.34", "2606:4700:4700::1111")
    got = await resolver.resolve("public.example", 443)
    assert [r["host"] for r in got] == ["93.184.216.34", "2606:4700:4700::1111"]
    assert all(refusal(ipaddress.ip_address(r["host"])) is None for r in got)
