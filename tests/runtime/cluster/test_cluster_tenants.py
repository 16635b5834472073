"""Cluster mode: named streams are per tenant in Redis too (the tenant is part of every key)."""
from __future__ import annotations

import aiohttp

from tests.support.cluster import frontend_args

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
