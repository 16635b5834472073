"""fnstream's job routes and openYuanrong's async invocation.

`GET /serverless/v1/jobs` (this tenant's, newest first), `GET /serverless/v1/jobs/{id}`,
`GET /serverless/v1/jobs/{id}/events` (SSE of every output item from the first or from
`Last-Event-ID`, live, then the result and `[DONE]`, for any number of readers; reads are never
destructive), `DELETE /serverless/v1/jobs/{id}` (cancel). openYuanrong: `X-Invoke-Type: async`
on the invoke routes answers `202 {"requestId"}` (see `submit_async`), and
`GET /serverless/v1/functions/async-results/{requestId}` its state. Errors: `{"code","message"}`.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from runtime.deployment import FunctionRef
from runtime.errors import BadRequestError
from runtime.jobs.key_store import KeyBind
from runtime.jobs.model import Job, JobRequest
from runtime.principal import Principal

from ..auth import principal_of
from ..idempotency import REPLAYED, submit_once
from ..jobs import JOBS, WEBHOOKS, find_job, job_headers
from ..keys import CONFIG, DISPATCHER
from ..sse import DONE_EVENT, EventStream, encode_event

__all__ = ("job_events", "last_event_id", "routes", "submit_async")

routes = web.RouteTableDef()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def last_event_id(request: web.Request) -> int:
    """Items already seen: `Last-Event-ID` (or `?lastEventId=` for clients that cannot set headers)."""
    raw = request.headers.get("Last-Event-ID", request.query.get("lastEventId", ""))
    if not raw.strip():
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        raise BadRequestError(f"Last-Event-ID must be a non-negative integer (got {raw[:40]!r})") from None
    if value < 0:
        raise BadRequestError(f"Last-Event-ID must be a non-negative integer (got {value})")
    return value


def _item_text(item: Any) -> str:
    return item if isinstance(item, str) else _dumps(item)


async def job_events(request: web.Request, job: Job) -> web.StreamResponse:
    """The job as SSE: item n is event `id: n`; then the result (or error) event and `data: [DONE]`.

    A `rawStream` function's items are sent verbatim, as on an SSE invoke."""
    after = last_event_id(request)
    manager = request.app[JOBS]
    heartbeat = request.app[CONFIG].frontend.args.heartbeatSeconds
    stream = EventStream(request, headers=job_headers(job, {"X-Job-Id": job.id}))
    sent = after
    async for batch in manager.follow(job, after, heartbeat):
        if not batch:
            await stream.ping()
            continue
        if job.raw:
            await stream.write("".join(_item_text(i) for i in batch).encode())
        else:
            frames = [encode_event(_item_text(item), sent + n) for n, item in enumerate(batch, 1)]
            await stream.write(b"".join(frames))
        sent += len(batch)
    if not job.final:  # the server is shutting down (follow returned early): a client resumes after the restart
        return await stream.finish()
    end_id = len(job.outputs) + 1
    if job.error is not None and (job.raw or after < end_id):
        await stream.write(encode_event(_dumps(job.error), None if job.raw else end_id))
    elif not job.raw and job.result is not None and not job.aggregated and after < end_id:
        await stream.write(encode_event(_dumps(job.result), end_id))
    if not job.raw:
        await stream.write(DONE_EVENT)
    return await stream.finish()


async def submit_async(request: web.Request, principal: Principal | None, function: FunctionRef,
                       event: Any) -> web.Response:
    """[jobs hook, invoke route] `X-Invoke-Type: async`: store the job, answer 202 {"requestId"}."""
    webhook = request.headers.get("X-Webhook-Url")
    if webhook is not None:
        webhook = request.app[WEBHOOKS].check_url(webhook)
    dispatcher = request.app[DISPATCHER]

    async def create(key: KeyBind | None) -> Job:
        return await dispatcher.submit_job(principal, function, event,
                                           JobRequest(api="yuanrong", webhook=webhook, key=key))

    job_id, job = await submit_once(request, function, ("yuanrong-async", event, webhook), create)
    replayed = job is None
    if job is None:  # the earlier request's job, for its X-Invocation-Id
        job = await find_job(request, job_id)
    headers = job_headers(job, {"X-Async-Request-Id": job_id}, REPLAYED if replayed else None)
    return web.json_response({"requestId": job_id}, status=202, headers=headers)


@routes.get("/serverless/v1/functions/async-results/{request_id}")
async def async_result(request: web.Request) -> web.Response:
    job = await find_job(request, request.match_info["request_id"])
    return web.json_response(job.yuanrong(), headers=job_headers(job))


@routes.get("/serverless/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        raise BadRequestError("limit must be an integer") from None
    if not 1 <= limit <= 1000:
        raise BadRequestError("limit must be between 1 and 1000")
    jobs = await request.app[JOBS].list_all(principal_of(request), request.query.get("function"), limit)
    return web.json_response({"jobs": [j.public() for j in jobs]})


@routes.get("/serverless/v1/jobs/{job_id}")
async def get_job(request: web.Request) -> web.Response:
    job = await find_job(request, request.match_info["job_id"])
    return web.json_response(job.public(), headers=job_headers(job))


@routes.get("/serverless/v1/jobs/{job_id}/events")
async def get_job_events(request: web.Request) -> web.StreamResponse:
    return await job_events(request, await find_job(request, request.match_info["job_id"]))


@routes.delete("/serverless/v1/jobs/{job_id}")
async def cancel_job(request: web.Request) -> web.Response:
    manager = request.app[JOBS]
    job = await manager.cancel(await find_job(request, request.match_info["job_id"]))
    await manager.wait(job, 5.0)
    return web.json_response(job.public(), headers=job_headers(job))
