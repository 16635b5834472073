"""The Host guard (frontend/hosts.py): DNS rebinding refused with 421 on both doors, and
X-Forwarded-Host believed from frontend.trustedProxies only."""
import asyncio
import json

import pytest

from frontend.app import build_app
from frontend.front_door import FrontDoor
from tests.support.servers import fn, test_config

INVOKE = "/serverless/v1/functions/record/invocations"
EVIL = "evil.example"


@pytest.fixture
async def host_client(make_client, deploy_dir):
    async def factory(**overrides):
        deploy = deploy_dir(fn("record", "observed_fns.record"))
        return await make_client(config=test_config(deploy, **overrides))
    return factory


async def _refused(resp) -> None:
    assert resp.status == 421, await resp.text()
    body = await resp.json()
    assert body["code"] == 200421 and "frontend.allowedHosts" in body["message"]


async def test_rebinding_host_is_421_on_the_fast_lane_and_the_app_path(host_client):
    client = await host_client()  # auth off, the shipped default
    port = client.server.port
    evil = f"{EVIL}:{port}"
    # a plain invoke (no Origin): the fast lane's request
    await _refused(await client.post(INVOKE, json={}, headers={"Host": evil}))
    # the rebinding page's own requests: same-origin to the browser
    origin = {"Host": evil, "Origin": f"http://{evil}"}
    await _refused(await client.post(INVOKE, json={}, headers=origin))
    await _refused(await client.get("/admin/v1/functions", headers=origin))
    await _refused(await client.delete("/admin/v1/functions/record", headers=origin))
    resp = await client.post("/v1/chat/completions", json={}, headers={"Host": evil})
    assert resp.status == 421 and "allowedHosts" in (await resp.json())["error"]["message"]  # OpenAI's shape
    assert (await client.get("/admin/v1/functions")).status == 200  # still deployed
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "10.1.2.3", "LOCALHOST."):
        resp = await client.post(INVOKE, json={}, headers={"Host": host})
        assert resp.status == 200, (host, await resp.text())


async def test_the_fast_lane_leaves_a_foreign_host_to_the_app():
    from tests.frontend.test_front_door import _never, _request
    door = FrontDoor(build_app(test_config()), _never)
    assert door._lane(_request("POST", INVOKE, {"Host": "localhost:1"}, b"{}")) == ("record", "json")
    assert door._lane(_request("POST", INVOKE, {"Host": f"{EVIL}:1"}, b"{}")) is None


async def test_allowed_hosts_configured(host_client):
    client = await host_client(**{"frontend.allowedHosts": ["fn.example.com"]})
    assert (await client.post(INVOKE, json={}, headers={"Host": "fn.example.com:443"})).status == 200
    await _refused(await client.post(INVOKE, json={}, headers={"Host": "127.0.0.1"}))
    client = await host_client(**{"frontend.allowedHosts": ["*"]})
    assert (await client.post(INVOKE, json={}, headers={"Host": EVIL})).status == 200


async def test_wildcard_bind_allows_any_name_only_with_auth(host_client):
    client = await host_client(**{"frontend.host": "0.0.0.0"})
    await _refused(await client.post(INVOKE, json={}, headers={"Host": EVIL}))
    assert (await client.post(INVOKE, json={}, headers={"Host": "192.0.2.7:8888"})).status == 200
    client = await host_client(**{"frontend.host": "0.0.0.0", "auth.tokens": [{"token": "t", "role": "user"}]})
    resp = await client.post(INVOKE, json={}, headers={"Host": EVIL, "Authorization": "Bearer t"})
    assert resp.status == 200


async def test_forwarded_host_is_believed_from_trusted_proxies_only(host_client):
    client = await host_client()
    # an untrusted client naming its own page's host: not this server's origin any more
    resp = await client.post(INVOKE, json={}, headers={"X-Forwarded-Host": EVIL, "Origin": f"http://{EVIL}"})
    assert resp.status == 403
    proxied = await host_client(**{"frontend.trustedProxies": ["127.0.0.0/8"],
                                   "frontend.allowedHosts": ["fn.example.com", "localhost", "127.0.0.1"]})
    resp = await proxied.post(INVOKE, json={}, headers={"X-Forwarded-Host": "fn.example.com",
                                                        "Origin": "http://fn.example.com"})
    assert resp.status == 200, await resp.text()
    await _refused(await proxied.post(INVOKE, json={}, headers={"X-Forwarded-Host": EVIL}))


def test_bad_trusted_proxy_is_a_config_error():
    from runtime.errors import ConfigError
    with pytest.raises(ConfigError, match="trustedProxies"):
        test_config(**{"frontend.trustedProxies": ["not-an-address"]})


async def _raw(port: int, head: str) -> tuple[int, dict]:
    """One request written as is (aiohttp's client would not send these forms)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode() + b"\r\n")
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"null")


@pytest.mark.parametrize("host", ["127.0.0.1:80@evil.example", "evil.example@127.0.0.1", "127.0.0.1:80:81",
                                  "127.0.0.1 evil.example", "[::1]evil", "[::1%25eth0]:80", "127.0.0.1:x",
                                  "127.0.0.1/evil", "localhost:80,evil.example", ":80", "", "127.0.0.1:99999",
                                  "[::1]:65536"])
async def test_a_host_that_is_not_host_port_is_400(host_client, host):
    client = await host_client()
    port = client.server.port
    for target in ("/admin/v1/functions", "/metrics"):
        status, body = await _raw(port, f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n")
        assert status == 400 and body["code"] == 200400 and "host[:port]" in body["message"], (host, body)
    status, body = await _raw(port, f"POST {INVOKE} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 2\r\n"
                                    "Connection: close\r\n\r\n{}")
    assert status == 400, (host, body)  # the fast lane leaves it to the app, which refuses it


async def test_an_absolute_form_target_is_judged_with_the_host_header(host_client):
    """RFC 9112 3.2.2: the target's authority is the request's host; the Host header is judged too."""
    client = await host_client()
    port = client.server.port
    admin = "http://127.0.0.1/admin/v1/functions"
    status, body = await _raw(port, f"GET {admin} HTTP/1.1\r\nHost: {EVIL}\r\nConnection: close\r\n")
    assert status == 421 and EVIL in body["message"]
    status, body = await _raw(port, f"GET http://{EVIL}/admin/v1/functions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                    "Connection: close\r\n")
    assert status == 421 and EVIL in body["message"]
    status, _ = await _raw(port, f"GET {admin} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n")
    assert status == 200
    status, _ = await _raw(port, f"GET http://[::1]:{port}/admin/v1/functions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Connection: close\r\n")
    assert status == 200


def test_host_grammar():
    from frontend.hosts import parse_host
    assert parse_host("LOCALHOST.:8080") == "localhost"
    assert parse_host("[::1]:1") == parse_host("::1") == parse_host("[0:0::1]") == "::1"
    assert parse_host("fn.example.com") == "fn.example.com"
    assert parse_host("127.0.0.1:65535") == parse_host("127.0.0.1:") == "127.0.0.1"
    for bad in ("a@b", "a:1:2", "[::1", "[fe80::1%eth0]", "a b", "a%41", "x" * 400, "[evil.example]", "a:65536",
                "[::1]:99999"):
        assert parse_host(bad) is None, bad
