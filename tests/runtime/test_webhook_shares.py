"""Webhook delivery concurrency is shared out per tenant (jobs.webhook.tenantConnections): one tenant's
slow receiver holds at most its share of connections and never delays another tenant's webhooks. Two
real receivers on loopback (jobs.webhook.allowPrivate), the real sender."""
from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from runtime.config import WebhookConfig
from runtime.jobs.model import Job
from runtime.jobs.webhooks import WebhookSender
from tests.support.waiting import eventually


async def _receiver(handler) -> TestServer:
    app = web.Application()
    app.router.add_post("/hook", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def _ended(job_id: str, tenant: str, url: str) -> Job:
    return Job(id=job_id, function="f", tenant=tenant, event={}, status="COMPLETED", result="ok", status_code=200,
               webhook=url)


async def test_one_tenants_slow_receiver_holds_only_its_share_and_delays_no_other_tenant() -> None:
    release = asyncio.Event()
    held: list[str] = []
    fast: list[str] = []

    async def slow_hook(request: web.Request) -> web.Response:
        held.append(request.headers["X-Async-Request-Id"])
        await release.wait()
        return web.json_response({})

    async def fast_hook(request: web.Request) -> web.Response:
        fast.append(request.headers["X-Async-Request-Id"])
        return web.json_response({})

    slow, quick = await _receiver(slow_hook), await _receiver(fast_hook)
    # More than aiohttp's default connector limit (100), which every tenant's deliveries used to share.
    config = WebhookConfig(allowPrivate=True, attempts=1, timeoutSeconds=120, queueSize=1000,
                           tenantQueueSize=240, tenantConnections=8)
    sender = WebhookSender(config)
    try:
        for n in range(150):
            sender.job_ended(_ended(f"a{n}", "alice", str(slow.make_url("/hook"))))
        await eventually(lambda: len(held) >= 8, "alice's share of deliveries to reach her slow receiver")
        sender.job_ended(_ended("b0", "bob", str(quick.make_url("/hook"))))
        await eventually(lambda: fast == ["b0"], "bob's webhook to reach his receiver")
        assert not release.is_set() and len(held) == 8  # while alice's still hang, and no more of them than her share
        release.set()
        await eventually(lambda: sender.delivered == 151, "every delivery once the slow receiver answers")
        assert sorted(held) == sorted(f"a{n}" for n in range(150))
    finally:
        release.set()
        await sender.close()
        await slow.close()
        await quick.close()
