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
            return any("acme/acme-relay" in w["functions"] for w in (await status_for("root"))["workers"])
        await wait_until(announced, "the worker announcing acme-relay")
        admin = await status_for("root")
        assert {"acme/acme-relay", "echo"} <= _names(admin)  # admin sees every tenant's, by key
        assert _names(await status_for("dev-acme")) == {"acme-relay"}  # only its own, in every list
        default = _names(await status_for("dev-default"))
        assert "echo" in default and "acme-relay" not in default
        acme_view = await status_for("dev-acme")
        assert [w["id"] for w in acme_view["workers"]] == [w["id"] for w in admin["workers"]]


async def test_queued_invocations_go_by_tenant_and_name(redis_server, start_server, start_worker):
    """Two tenants' `fc` through a frontend-only node: each queue is its tenant's (`{queue:acme/fc}`),
    a worker runs each tenant's own code, and another node learns both from the shared registry."""
    args = ("-s", f"auth.tokens={json.dumps(TOKENS)}")
    front = start_server(*frontend_args(redis_server.url), *args)
    other = start_server(*frontend_args(redis_server.url), *args)
    start_worker(redis_server.url)
    acme, default = bearer("dev-acme"), bearer("dev-default")
    async with aiohttp.ClientSession() as s:
        for headers, handler in ((acme, "echo.handler"), (default, "hello.handler")):
            spec = {"name": "fc", "handler": handler, "codePath": "."}
            async with s.post(front.url + "/admin/v1/functions", json=spec, headers=headers) as r:
                assert r.status == 201, await r.text()  # default's is not a 409

        async def serving():  # readiness: the worker announces both tenants' `fc`
            async with s.get(front.url + "/cluster/v1/status", headers=bearer("root")) as r:
                names = [f for w in (await r.json())["workers"] for f in w["functions"]]
            return "acme/fc" in names and "fc" in names
        await wait_until(serving, "the worker serving both tenants' fc")

        async def answer(node, headers: dict, accept: str = "application/json") -> tuple[int, str]:
            async with s.post(node.url + "/serverless/v1/functions/fc/invocations", json={"who": 1},
                              headers={**headers, "Accept": accept}) as r:
                return r.status, await r.text()

        for node in (front, other):
            async def known(node=node):  # readiness: this node has both from the shared registry
                return (await answer(node, default))[0] == 200 and (await answer(node, acme))[0] == 200
            await wait_until(known, "both fc known")
            assert json.loads((await answer(node, acme))[1]) == {"who": 1}
            assert json.loads((await answer(node, default))[1]) == "ok"
            status, text = await answer(node, acme, "text/event-stream")
            assert status == 200 and '"who"' in text and "this is a stream" not in text, text
        async with s.delete(front.url + "/admin/v1/functions/fc", headers=acme) as r:
            assert r.status == 200

        async def gone():
            return (await answer(other, acme))[0] == 404
        await wait_until(gone, "acme's fc deleted everywhere")
        assert json.loads((await answer(other, default))[1]) == "ok"  # default's stays
    keys = redis_server.client().keys("*{queue:*")
    assert any("{queue:acme/fc}" in k for k in keys) and any("{queue:fc}" in k for k in keys), keys
