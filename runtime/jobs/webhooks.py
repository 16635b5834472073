"""Webhooks: when a job with a webhook ends, POST its result there, retrying with backoff.

openYuanrong's body `{"requestId","status","statusCode","result" (base64 of the body),"error",
"completedAt"}` with `X-Async-Request-Id`; RunPod jobs get RunPod's status object. Attempts wait
1 s, 2 s, 4 s ... between them (`jobs.webhook.attempts`, each bounded by `timeoutSeconds`); failures
are logged, never retried forever. At most `queueSize` deliveries are pending, at most
`tenantQueueSize` of one tenant; beyond, a delivery is dropped and logged. At most
`tenantConnections` attempts of one tenant are in flight at once (the connector has no shared cap of
its own: aiohttp's default 100 let one tenant's slow receiver hold every connection). `allowedHosts`
(empty = any) limits the hosts a webhook may name; loopback, private and other non-public addresses
are refused unless `allowPrivate` (runtime/jobs/webhook_guard.py). Every attempt carries the
Standard Webhooks headers, signed with each `secret` (runtime/jobs/signing.py): the body is
serialized once, so the bytes signed are the bytes sent.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import json
import logging
import time
import urllib.parse
from typing import Any

import aiohttp

from ..config import WebhookConfig
from ..tasks import stop_tasks
from .errors import JobBadRequestError
from .model import YUANRONG_STATUS, Job
from .signing import decode_secret, message_id, signature_headers
from .webhook_guard import GuardedResolver, WebhookRefused, literal_address, refusal

__all__ = ("WebhookSender", "webhook_body")

log = logging.getLogger("fnstream.jobs")

MAX_URL = 2048


def webhook_body(job: Job) -> dict[str, Any]:
    if job.api != "yuanrong":
        return job.runpod()
    answer = job.result if job.error is None else job.error
    body = json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()
    return {"requestId": job.id, "status": YUANRONG_STATUS[job.status], "statusCode": job.status_code,
            "result": base64.b64encode(body).decode(), "error": (job.error or {}).get("message", ""),
            "completedAt": job.completed_at_rfc3339()}


class WebhookSender:
    """Delivers job-end webhooks in the background (one task per delivery, bounded in number)."""

    def __init__(self, config: WebhookConfig, *, backoff: float = 1.0) -> None:
        self.config = config
        self.backoff = backoff
        self._keys = [decode_secret(s) for s in config.secret]  # checked already when the config loaded
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self.delivered = 0
        self.failed = 0
        self.dropped = 0
        self._pending: collections.Counter[str] = collections.Counter()  # per tenant: jobs.webhook.tenantQueueSize
        self._shares: dict[str, asyncio.Semaphore] = {}  # per tenant with pending ones: jobs.webhook.tenantConnections

    def check_url(self, url: Any) -> str:
        """The URL if a webhook may call it; 400 otherwise."""
        if not isinstance(url, str) or not url or len(url) > MAX_URL:
            raise JobBadRequestError(f"webhook must be an http(s) URL of at most {MAX_URL} characters")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise JobBadRequestError(f"webhook {url!r} is not an http(s) URL")
        allowed = [h.lower() for h in self.config.allowedHosts]
        if allowed and parts.hostname.lower() not in allowed:
            raise JobBadRequestError(f"webhook host {parts.hostname!r} is not in jobs.webhook.allowedHosts")
        reason = self._literal_refusal(parts.hostname)
        if reason is not None:
            raise JobBadRequestError(f"webhook {url!r} is refused: {reason}")
        return url

    def _literal_refusal(self, host: str) -> str | None:
        """Why a webhook may not call `host`, a literal address (names are judged at delivery)."""
        if self.config.allowPrivate:
            return None
        address = literal_address(host)
        reason = None if address is None else refusal(address)
        return None if reason is None else f"{reason} (set jobs.webhook.allowPrivate to allow it)"

    def job_ended(self, job: Job) -> None:
        """The JobManager's on_final callback."""
        if job.webhook is None:
            return
        tenant = job.tenant
        if self._pending[tenant] >= self.config.tenantQueueSize:
            self.dropped += 1
            log.warning("webhook of job %s dropped: %d deliveries of tenant %s pending "
                        "(jobs.webhook.tenantQueueSize)", job.id, self._pending[tenant], tenant)
            return
        if len(self._tasks) >= self.config.queueSize:
            self.dropped += 1
            log.warning("webhook of job %s dropped: %d deliveries pending (jobs.webhook.queueSize)",
                        job.id, len(self._tasks))
            return
        body = json.dumps(webhook_body(job), ensure_ascii=False, separators=(",", ":")).encode()
        share = self._shares.get(tenant)
        if share is None:
            share = self._shares[tenant] = asyncio.Semaphore(self.config.tenantConnections)
        task = asyncio.get_running_loop().create_task(
            self._deliver(job.id, job.webhook, body, message_id(job.id, job.retried), share), name=f"webhook-{job.id}")
        self._tasks.add(task)
        self._pending[tenant] += 1
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._delivered_for(tenant))

    def _delivered_for(self, tenant: str) -> None:
        self._pending[tenant] -= 1
        if self._pending[tenant] <= 0:
            del self._pending[tenant]
            self._shares.pop(tenant, None)  # none of its deliveries waits on it

    async def _deliver(self, job_id: str, url: str, body: bytes, msg_id: str, share: asyncio.Semaphore) -> None:
        if self._session is None:
            # Names resolve through the guard, and the connection goes to the addresses it checked.
            # No cap of the connector's own (limit=0): each tenant's share bounds its connections,
            # queueSize all of them.
            connector = (aiohttp.TCPConnector(limit=0) if self.config.allowPrivate
                         else aiohttp.TCPConnector(limit=0, resolver=GuardedResolver()))
            self._session = aiohttp.ClientSession(connector=connector)
        reason = self._literal_refusal(urllib.parse.urlsplit(url).hostname or "")
        if reason is not None:  # a job accepted before the guard, or under another config
            self.failed += 1
            log.warning("webhook of job %s to %s refused: %s", job_id, url, reason)
            return
        timeout = aiohttp.ClientTimeout(total=self.config.timeoutSeconds)
        for attempt in range(1, self.config.attempts + 1):
            # Signed afresh each attempt (receivers refuse old timestamps); the id stays: they dedupe on it.
            headers = {"X-Async-Request-Id": job_id, "Content-Type": "application/json",
                       **signature_headers(self._keys, msg_id, int(time.time()), body)}
            try:
                async with share, self._session.post(url, data=body, headers=headers, timeout=timeout,
                                                     allow_redirects=False) as resp:
                    if 200 <= resp.status < 300:
                        self.delivered += 1
                        return
                    problem = f"HTTP {resp.status}"
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, WebhookRefused):  # not retried: it would be refused again
                    self.failed += 1
                    log.warning("webhook of job %s to %s refused: %s", job_id, url, exc.os_error)
                    return
                problem = f"{type(exc).__name__}: {exc}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt < self.config.attempts:
                delay = self.backoff * 2 ** (attempt - 1)
                log.info("webhook of job %s: attempt %d failed (%s); retrying in %g s", job_id, attempt, problem, delay)
                await asyncio.sleep(delay)
            else:
                self.failed += 1
                log.warning("webhook of job %s to %s failed after %d attempts: %s", job_id, url, attempt, problem)

    async def close(self) -> None:
        await stop_tasks(list(self._tasks), "webhooks")
        if self._session is not None:
            await self._session.close()
