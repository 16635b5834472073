"""The `jobs` section of fnstream's configuration (runtime/config.py): background jobs and their
webhooks; every key is documented in docs/configuration.md."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .jobs.signing import decode_secret

__all__ = ("JobsConfig", "WebhookConfig")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)  # as runtime/config.py's


class WebhookConfig(_Strict):
    """Job-end webhook deliveries (runtime/jobs/webhooks.py)."""

    timeoutSeconds: float = Field(10, gt=0, description="per delivery attempt")
    attempts: int = Field(4, ge=1, le=10, description="first try plus retries after 1 s, 2 s, 4 s, ...")
    queueSize: int = Field(1000, ge=1, description="deliveries pending at once; beyond, dropped and logged")
    tenantQueueSize: int = Field(100, ge=1, description="deliveries of one tenant pending at once: one tenant's "
                                                        "slow receiver never gets another tenant's webhooks "
                                                        "dropped")
    tenantConnections: int = Field(20, ge=1, description="deliveries of one tenant in flight at once (each its own "
                                                         "connection); the rest of its pending ones wait their "
                                                         "turn: one tenant's slow receiver never delays another "
                                                         "tenant's webhooks")
    allowedHosts: list[str] = Field(default_factory=list, description="hosts a webhook may call (empty = any): set "
                                                                      "it so a job cannot make the server call "
                                                                      "internal addresses")
    allowPrivate: bool = Field(False, description="let webhooks call loopback, private, link-local and other "
                                                  "non-public addresses (refused by default: any user could make "
                                                  "the server call them)")
    secret: list[str] = Field(default_factory=list, description="`whsec_<base64>` secret(s) signing every "
                              "delivery (Standard Webhooks `webhook-signature`); a list signs with each, so "
                              "receivers keep verifying while secrets rotate; empty = unsigned")

    @field_validator("secret", mode="before")
    @classmethod
    def _secrets(cls, value: Any) -> Any:
        """One secret or a list; each a `whsec_` secret of at least 24 bytes (never echoed back)."""
        secrets = [value] if isinstance(value, str) else value
        if isinstance(secrets, list):
            for text in secrets:
                if isinstance(text, str):
                    decode_secret(text)
        return secrets


class JobsConfig(_Strict):
    """Background jobs (runtime/jobs; every key is documented in docs/jobs.md)."""

    store: Literal["auto", "sqlite", "memory", "redis"] = Field(
        "auto", description="`auto` = `redis` in cluster mode (`cluster.redisUrl`), else `sqlite`; or `sqlite`, "
                            "`memory`, `redis`")
    path: Path = Field(Path("jobs.sqlite3"), description="the SQLite file; a relative path is inside "
                       "`runtime.dataDir`")
    maxQueued: int = Field(1000, ge=1, description="jobs waiting to start; 429 beyond")
    maxQueuedPerTenant: int = Field(250, ge=1, description="jobs of one tenant waiting to start; 429 beyond for "
                                                           "that tenant only, so one tenant's backlog never "
                                                           "refuses another's jobs")
    maxInputBytes: int = Field(10 * 1024 * 1024, ge=1, description="input bytes (its JSON) per job, RunPod's "
                                                                   "`/run` limit; beyond, 413 at submit (a `/v2` "
                                                                   "body over it is refused before it is parsed, "
                                                                   "as RunPod counts the payload; the body is also "
                                                                   "bounded by "
                                                                   "`frontend.args.maxRequestBodySize`)")
    maxInputBytesSync: int = Field(20 * 1024 * 1024, ge=1,
                                   description="the same for `/runsync` (RunPod's limit)")
    tenantQuotaBytes: int = Field(1024 * 1024 * 1024, ge=1,
                                  description="bytes (inputs plus outputs) one tenant's kept jobs may hold until "
                                              "they expire; beyond, 507 at submit")
    maxOutputBytes: int = Field(10 * 1024 * 1024, ge=1, description="output bytes per job; beyond, the job is "
                                                                    "`FAILED` (413)")
    cacheBytes: int = Field(64 * 1024 * 1024, ge=0, description="bytes of finished jobs' inputs, outputs and "
                            "results kept in memory (the most recently finished); the others are read back from "
                            "the store when asked for (SQLite store only)")
    retentionSeconds: float = Field(3600, gt=0, description="finished jobs and their output expire after this "
                                                            "(openYuanrong keeps 60 minutes)")
    runsyncWaitMs: int = Field(90_000, ge=0, description="default and maximum `wait` of `/runsync`")
    idempotencySeconds: float = Field(86400, gt=0, description="how long an `Idempotency-Key` of a job submit "
                                      "names its job (a day, as Stripe: a client's retries through an outage "
                                      "fall within it; it may outlive the job, whose retry still never runs "
                                      "twice)")
    takeoverSeconds: float = Field(15, gt=0, description="cluster mode: how long after a node stops renewing its "
                                                         "lease its unfinished jobs pass to another node (the "
                                                         "restart rules apply)")
    webhook: WebhookConfig = Field(WebhookConfig(), description="job-end webhook deliveries")
