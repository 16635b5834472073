"""[jobs] `Idempotency-Key` on the submit routes (openYuanrong async, RunPod `/run` and `/runsync`):
the route names what makes a request "the same", runtime/jobs/idempotency.py does the rest."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from runtime.deployment import FunctionRef
from runtime.jobs.idempotency import fingerprint, parse_key
from runtime.jobs.key_store import KeyBind
from runtime.jobs.model import Job

from .jobs import IDEMPOTENCY

__all__ = ("REPLAYED", "submit_once")

REPLAYED = {"Idempotent-Replayed": "true"}  # the answer names the job an earlier request made (as Stripe)


async def submit_once(request: web.Request, function: FunctionRef, parts: tuple[Any, ...],
                      create: Callable[[KeyBind | None], Awaitable[Job]]) -> tuple[str, Job | None]:
    """`create(None)` the job, or with an `Idempotency-Key` `create(key)` (the job's save binds
    the key), unless the key already names a job: then None as the job (the route answers as it
    did the first time). `parts` (route, body ...) are what a second request with the key must
    repeat; computed now, before `create` may touch them."""
    key = parse_key(request.headers.get("Idempotency-Key"))
    if key is None:
        job = await create(None)
        return job.id, job
    print_ = fingerprint(function.spec.urn, *parts)  # tenant, namespace, name and version
    return await request.app[IDEMPOTENCY].submit(function.spec.tenant, key, print_, create)
