"""RunPod's serverless endpoint API: the `runpod` SDK works unchanged against `http://HOST:PORT/v2`.

The endpoint id is the function name. `POST /v2/{fn}/run`, `POST /v2/{fn}/runsync[?wait=ms]`,
`GET /v2/{fn}/status/{id}`, `GET|POST /v2/{fn}/stream/{id}` (the items not returned by `/stream`
before, as RunPod; with `Accept: text/event-stream` the live SSE of /jobs/{id}/events instead),
`POST /v2/{fn}/cancel/{id}`, `POST /v2/{fn}/retry/{id}`, `POST /v2/{fn}/purge-queue`,
`GET /v2/{fn}/health`, and `/v2/{fn}/openai/v1/...` (the OpenAI routes served by that function).
Errors are RunPod's `{"error": message}` (OpenAI's shape under `/openai/v1/`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from runtime.deployment import Deployment, FunctionRef
from runtime.jobs.errors import JobBadRequestError, JobInputTooLargeError
from runtime.jobs.key_store import KeyBind
from runtime.jobs.model import Job, JobRequest

from ..auth import principal_of
from ..body import max_body_values, parse_json_body, read_body
from ..idempotency import REPLAYED, submit_once
from ..jobs import JOBS, WEBHOOKS, find_job, job_headers
from ..keys import CONFIG, DISPATCHER
from ..negotiation import parse_accept, quality
from . import openai
from .jobs import job_events

__all__ = ("routes",)

routes = web.RouteTableDef()


def _function(request: web.Request) -> FunctionRef:
    """The endpoint's function (the endpoint id is its name), here or known to the cluster; 404/403."""
    return request.app[DISPATCHER].find(principal_of(request), request.match_info["fn"])


def _milliseconds(policy: dict[str, Any], key: str) -> float | None:
    value = policy.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise JobBadRequestError(f"policy.{key} must be a positive integer of milliseconds (got {value!r})")
    return value / 1000


async def _submit(request: web.Request, *, sync: bool = False) -> tuple[Job, bool]:
    """(the job, whether an Idempotency-Key named a job an earlier request made)."""
    function = _function(request)
    if "X-Instance-Session" in request.headers:  # a job runs later, outside any session: not silently dropped
        raise JobBadRequestError("header X-Instance-Session cannot be used with /v2 jobs "
                                 "(a background job runs outside any session)")
    raw = await read_body(request)
    jobs = request.app[CONFIG].jobs
    limit, key = (jobs.maxInputBytesSync, "jobs.maxInputBytesSync") if sync else (jobs.maxInputBytes,
                                                                                  "jobs.maxInputBytes")
    if len(raw) > limit:  # RunPod's limit is on the payload: refused before the parse and the input's re-encode
        raise JobInputTooLargeError(f"the request body is {len(raw)} bytes; at most {limit} ({key})")
    body = parse_json_body(raw, max_body_values(request.app))
    del raw
    if not isinstance(body, dict) or "input" not in body:
        raise JobBadRequestError('the request body must be a JSON object with an "input" key')
    policy = body.get("policy")
    policy = {} if policy is None else policy
    if not isinstance(policy, dict):
        raise JobBadRequestError("policy must be an object")
    webhook = body.get("webhook")
    if webhook is not None:
        webhook = request.app[WEBHOOKS].check_url(webhook)
    event = {"id": None, "input": body["input"]}
    job_request = JobRequest(api="runpod", webhook=webhook, execution_timeout=_milliseconds(policy, "executionTimeout"),
                             ttl=_milliseconds(policy, "ttl"), sync=sync)
    dispatcher, principal = request.app[DISPATCHER], principal_of(request)

    async def create(key: KeyBind | None) -> Job:
        return await dispatcher.submit_job(principal, function, event, dataclasses.replace(job_request, key=key))

    job_id, job = await submit_once(request, function, ("runsync" if sync else "run", body), create)
    if job is None:  # the earlier request's job (for its X-Invocation-Id; /runsync waits for it)
        return await find_job(request, job_id), True
    return job, False


@routes.post("/v2/{fn}/run")
async def run(request: web.Request) -> web.Response:
    job, replayed = await _submit(request)
    # It may have started already while it was being stored; it was acknowledged as queued (and a
    # replay answers as the first answer did: /status says how it is now).
    headers = job_headers(job, REPLAYED if replayed else None)
    return web.json_response({"id": job.id, "status": "IN_QUEUE"}, headers=headers)


@routes.post("/v2/{fn}/runsync")
async def runsync(request: web.Request) -> web.Response:
    limit = request.app[CONFIG].jobs.runsyncWaitMs
    raw = request.query.get("wait")
    try:
        wait = limit if raw is None else int(raw)
    except ValueError:
        raise JobBadRequestError(f"wait must be an integer of milliseconds (got {raw!r})") from None
    if wait < 0:
        raise JobBadRequestError(f"wait must not be negative (got {wait})")
    job, replayed = await _submit(request, sync=True)  # (a replay's job is waited for again)
    await request.app[JOBS].wait(job, min(wait, limit) / 1000)
    return web.json_response(job.runpod(), headers=job_headers(job, REPLAYED if replayed else None))


@routes.get("/v2/{fn}/status/{job_id}")
async def status(request: web.Request) -> web.Response:
    dep = _function(request)
    job = await find_job(request, request.match_info["job_id"], dep.key)
    return web.json_response(job.runpod(), headers=job_headers(job))


async def _stream(request: web.Request) -> web.StreamResponse:
    dep = _function(request)
    job = await find_job(request, request.match_info["job_id"], dep.key)
    if quality(parse_accept(request.headers.get("Accept")), "text/event-stream", wildcards=False) > 0:
        return await job_events(request, job)
    items = await request.app[JOBS].advance_stream(job)
    return web.json_response({"id": job.id, "status": job.status, "stream": [{"output": i} for i in items]},
                             headers=job_headers(job))


routes.get("/v2/{fn}/stream/{job_id}")(_stream)
routes.post("/v2/{fn}/stream/{job_id}")(_stream)


@routes.post("/v2/{fn}/cancel/{job_id}")
async def cancel(request: web.Request) -> web.Response:
    dep = _function(request)
    manager = request.app[JOBS]
    job = await manager.cancel(await find_job(request, request.match_info["job_id"], dep.key))
    await manager.wait(job, 5.0)  # a running job stops at its next step; say how it ended
    return web.json_response({"id": job.id, "status": job.status}, headers=job_headers(job))


@routes.post("/v2/{fn}/retry/{job_id}")
async def retry(request: web.Request) -> web.Response:
    dep = _function(request)
    job = await request.app[JOBS].retry(await find_job(request, request.match_info["job_id"], dep.key))
    return web.json_response({"id": job.id, "status": job.status}, headers=job_headers(job))  # the new run's id


@routes.post("/v2/{fn}/purge-queue")
async def purge_queue(request: web.Request) -> web.Response:
    dep = _function(request)
    removed = await request.app[JOBS].purge(dep.name, dep.spec.tenant)   # every node's, in cluster mode
    return web.json_response({"removed": removed, "status": "completed"})


@routes.get("/v2/{fn}/health")
async def health(request: web.Request) -> web.Response:
    dep = _function(request)
    counts = await request.app[JOBS].counts_all(dep.name, dep.spec.tenant)   # every node's, in cluster mode
    running = dep.inflight if isinstance(dep, Deployment) else 0  # cluster mode: known here, run elsewhere
    return web.json_response({"jobs": counts,
                              "workers": {"idle": max(0, dep.spec.concurrency - running), "running": running}})


@routes.post("/v2/{fn}/openai/v1/chat/completions")
async def openai_chat(request: web.Request) -> web.StreamResponse:
    return await openai.serve_openai(request, openai.CHAT_ROUTE, request.match_info["fn"])


@routes.post("/v2/{fn}/openai/v1/completions")
async def openai_completions(request: web.Request) -> web.StreamResponse:
    return await openai.serve_openai(request, openai.COMPLETIONS_ROUTE, request.match_info["fn"])


@routes.get("/v2/{fn}/openai/v1/models")
async def openai_models(request: web.Request) -> web.Response:
    dep = _function(request)
    models = dep.spec.served_models()  # models and aliases; the function's name when it lists none
    return web.json_response({"object": "list", "data": [openai.model_object(m, dep) for m in models]})
