"""Signed webhooks (Standard Webhooks): a loopback receiver verifies every delivery with the
`standardwebhooks` package, as a user's receiver would; rotation, retries and tampering."""
from __future__ import annotations

import asyncio
import base64
import os

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from frontend.jobs import WEBHOOKS
from runtime.config import load_config
from runtime.errors import ConfigError

INVOKE = "/serverless/v1/functions/{}/invocations"
ASYNC = {"X-Invoke-Type": "async"}


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


OLD, NEW = new_secret(), new_secret()


@pytest.fixture
async def receiver():
    """Records (headers, raw body) of each POST; answers 500 to the first `fail_first`."""
    calls: list[tuple[dict[str, str], bytes]] = []
    state = {"fail_first": 0}

    async def hook(request: web.Request) -> web.Response:
        calls.append((dict(request.headers), await request.read()))
        return web.Response(status=500 if len(calls) <= state["fail_first"] else 200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield server, calls, state
    await server.close()


async def until(predicate, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(what)


async def signed_jobs(make_client, job_config, secret):
    client = await make_client(config=job_config(**{"jobs.webhook.allowPrivate": True,
                                                    "jobs.webhook.secret": secret}))
    client.server.app[WEBHOOKS].backoff = 0.01  # retries at once: the test is about their headers
    return client


async def test_each_attempt_verifies_and_keeps_its_id(make_client, job_config, receiver):
    server, calls, state = receiver
    state["fail_first"] = 1
    jobs = await signed_jobs(make_client, job_config, NEW)
    url = str(server.make_url("/hook"))
    resp = await jobs.post(INVOKE.format("writer"), json={"n": 1}, headers={**ASYNC, "X-Webhook-Url": url})
    request_id = (await resp.json())["requestId"]
    await until(lambda: len(calls) == 2, f"two attempts expected, got {len(calls)}")
    (first, body1), (second, body2) = calls
    for headers, body in calls:
        payload = Webhook(NEW).verify(body, headers)
        assert payload["requestId"] == request_id and payload["status"] == "completed"
        assert headers["webhook-signature"].startswith("v1,")
    assert first["webhook-id"] == second["webhook-id"]  # one delivery: receivers dedupe on it
    assert body1 == body2
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body1, first)  # another secret's receiver refuses it
    tampered = body1.replace(b'"completed"', b'"failed"')
    assert tampered != body1
    with pytest.raises(WebhookVerificationError):
        Webhook(NEW).verify(tampered, first)


async def test_rotated_secrets_verify_with_either(make_client, job_config, receiver):
    server, calls, _ = receiver
    jobs = await signed_jobs(make_client, job_config, [NEW, OLD])
    resp = await jobs.post("/v2/echo-job/run", json={"input": {"a": 1}, "webhook": str(server.make_url("/hook"))})
    job_id = (await resp.json())["id"]
    await until(lambda: calls, "no delivery")
    headers, body = calls[0]
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (NEW, OLD):
        payload = Webhook(secret).verify(body, headers)
        assert payload["id"] == job_id and payload["status"] == "COMPLETED"
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)


async def test_a_retried_job_is_a_new_message(make_client, job_config, receiver):
    """A job run again by /retry ends again: a new delivery, so a new id (not deduped away)."""
    server, calls, _ = receiver
    jobs = await signed_jobs(make_client, job_config, NEW)
    resp = await jobs.post("/v2/raises/run", json={"input": {}, "webhook": str(server.make_url("/hook"))})
    job_id = (await resp.json())["id"]
    await until(lambda: len(calls) == 1, "no first delivery")
    resp = await jobs.post(f"/v2/raises/retry/{job_id}")
    assert resp.status == 200, await resp.text()
    await until(lambda: len(calls) == 2, "no second delivery")
    ids = [Webhook(NEW).verify(body, headers) and headers["webhook-id"] for headers, body in calls]
    assert ids[0] != ids[1]


async def test_unsigned_without_a_secret(private_jobs_unsigned, receiver):
    server, calls, _ = receiver
    url = str(server.make_url("/hook"))
    await private_jobs_unsigned.post(INVOKE.format("writer"), json={}, headers={**ASYNC, "X-Webhook-Url": url})
    await until(lambda: calls, "no delivery")
    headers, _ = calls[0]
    assert headers["webhook-id"].startswith("msg_") and headers["webhook-timestamp"].isdigit()
    assert "webhook-signature" not in headers


@pytest.fixture
async def private_jobs_unsigned(make_client, job_config):
    return await make_client(config=job_config(**{"jobs.webhook.allowPrivate": True}))


@pytest.mark.parametrize("secret", ["not-prefixed", "whsec_###", "whsec_" + base64.b64encode(b"short").decode()])
def test_a_malformed_secret_is_refused_at_start_without_echoing_it(secret):
    with pytest.raises(ConfigError) as err:
        load_config(data={"jobs": {"webhook": {"secret": [NEW, secret]}}})
    assert "jobs.webhook.secret" in str(err.value) and secret not in str(err.value)
    assert NEW not in str(err.value)
