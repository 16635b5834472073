"""Cluster mode: named streams are per tenant in Redis too (the tenant is part of every key)."""
from __future__ import annotations

import json

import aiohttp

from tests.support.cluster import RELAY, frontend_args, wait_until

STREAMS = "/serverless/v1/streams"


async def test_redis_stream_keys_are_per_tenant(redis_server, start_server):
    a = start_server(*frontend_args(redis_server.url, role="all"))
    b = start_server(*frontend_args(redis_server.url, role="all"))
    acme = {"X-Tenant-ID": "acme"}  # auth is off: any tenant may be named
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{a.url}{STREAMS}/orders?retain_num=10", json=["acme-1"], headers=acme) as r:
            assert r.status == 200, await r.text()
        async with s.post(f"{a.url}{STREAMS}/orders?retain_num=10", json=["default-1", "default-2"]) as r:
            assert (await r.json())["ids"] == [1, 2]
        async with s.get(f"{b.url}{STREAMS}") as r:  # another node, the default tenant
            assert [(x["name"], x["produced"]) for x in (await r.json())["streams"]] == [("orders", 2)]
        async with s.get(f"{b.url}{STREAMS}/orders?from_id=0&expect_num=1", headers=acme) as r:
            assert "acme-1" in (await r.text())
        async with s.delete(f"{b.url}{STREAMS}/orders", headers=acme) as r:
            assert r.status == 200
        async with s.get(f"{a.url}{STREAMS}?stream=orders") as r:
            assert (await r.json())["streams"][0]["retained"] == 2  # the default tenant's is untouched
    keys = sorted(redis_server.client().keys("*{stream:*"))
    assert keys and all("{stream:default/orders}" in k for k in keys), keys



TOKENS = [{"token": "dev-acme", "tenant": "acme", "role": "developer"},
          {"token": "dev-default", "tenant": "default", "role": "developer"},
          {"token": "root", "tenant": "ops", "role": "admin"}]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _names(status: dict) -> set[str]:
    """Every function name a /cluster/v1/status answer shows, wherever it appears."""
    names = set(status["functions"]) | set(status["unavailable"])
    for worker in status["workers"]:
        names |= set(worker["functions"])
    return names


async def test_cluster_status_shows_a_token_only_its_own_tenants_functions(redis_server, start_server):
    node = start_server(*frontend_args(redis_server.url, role="all"), "-s", f"auth.tokens={json.dumps(TOKENS)}")
    acme_fn = {**RELAY, "name": "acme-relay", "tenant": "acme"}
    async with aiohttp.ClientSession() as s:
        async with s.post(node.url + "/admin/v1/functions", json=acme_fn, headers=bearer("root")) as r:
            assert r.status == 201, await r.text()

        async def status_for(token: str) -> dict:
            async with s.get(node.url + "/cluster/v1/status", headers=bearer(token)) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        async def announced():  # readiness: the worker's heartbeat lists the new function
            return any("acme-relay" in w["functions"] for w in (await status_for("root"))["workers"])
        await wait_until(announced, "the worker announcing acme-relay")
        admin = await status_for("root")
        assert {"acme-relay", "echo"} <= _names(admin)  # admin sees every tenant's
        assert _names(await status_for("dev-acme")) == {"acme-relay"}  # only its own, in every list
        default = _names(await status_for("dev-default"))
        assert "echo" in default and "acme-relay" not in default
        acme_view = await status_for("dev-acme")
        assert [w["id"] for w in acme_view["workers"]] == [w["id"] for w in admin["workers"]]
