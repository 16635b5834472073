"""Tenant B's things for the tenant boundary probe (tests/frontend/test_tenant_boundary.py).

Tenant B is `default` (it owns the bundled functions, among them `chat` and its model); tenant A
is `acme`. `plant` gives B a finished RunPod job, an openYuanrong async job, an open instance
session and a named stream with retained data, every one carrying SECRET; `snapshot` is what B
itself sees of them, to compare after A's probe.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

TOKENS = [{"token": "dev-a", "tenant": "acme", "role": "developer"},
          {"token": "user-a", "tenant": "acme", "role": "user"},
          {"token": "dev-b", "tenant": "default", "role": "developer"},
          {"token": "user-b", "tenant": "default", "role": "user"}]
SECRET = "b-secret-9f2c"
MODEL = "fnstream-standin"   # the model of B's bundled `chat`
SESSION = "b-session"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class World:
    runpod_job: str
    async_job: str
    invocation: str = ""  # B's SSE invocation (its output, kept, holds the secret)


async def _wait_done(client: Any, job_id: str) -> None:
    for _ in range(500):  # readiness: the job has ended (echo answers at once)
        body = await (await client.get(f"/serverless/v1/jobs/{job_id}", headers=bearer("user-b"))).json()
        if body["status"] not in ("IN_QUEUE", "IN_PROGRESS"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} did not end")


async def plant(client: Any) -> World:
    """B's jobs, session and stream; A's own function `a-echo` (for probes that name A's function)."""
    user_b = bearer("user-b")
    r = await client.post("/v2/echo/run", json={"input": {"secret": SECRET}}, headers=user_b)
    assert r.status == 200, await r.text()
    runpod_job = (await r.json())["id"]
    r = await client.post("/serverless/v1/functions/echo/invocations", json={"secret": SECRET},
                          headers={**user_b, "X-Invoke-Type": "async"})
    assert r.status == 202, await r.text()
    async_job = (await r.json())["requestId"]
    session = json.dumps({"sessionID": SESSION, "sessionTTL": 600})
    r = await client.post("/serverless/v1/functions/echo/invocations", json={},
                          headers={**user_b, "X-Instance-Session": session})
    assert r.status == 200, await r.text()
    r = await client.post("/serverless/v1/streams/b-stream?retain_num=10", json=[SECRET], headers=bearer("dev-b"))
    assert r.status == 200, await r.text()
    r = await client.post("/admin/v1/functions", json={"name": "a-echo", "handler": "echo.handler",
                                                       "codePath": "."}, headers=bearer("dev-a"))
    assert r.status == 201, await r.text()
    r = await client.post("/serverless/v1/functions/echo/invocations", json={"secret": SECRET},
                          headers={**user_b, "Accept": "text/event-stream"})
    assert r.status == 200 and SECRET in await r.text()
    invocation = r.headers["X-Invocation-Id"]
    for job in (runpod_job, async_job):
        await _wait_done(client, job)
    return World(runpod_job, async_job, invocation)


async def snapshot(client: Any, world: World) -> dict[str, Any]:
    """What B sees of its things (statuses, outputs, the function's revision, the stream's counters)."""
    user_b, dev_b = bearer("user-b"), bearer("dev-b")
    jobs = {}
    for job in (world.runpod_job, world.async_job):
        body = await (await client.get(f"/serverless/v1/jobs/{job}", headers=user_b)).json()
        jobs[job] = {k: body.get(k) for k in ("status", "output", "error", "tenant", "function")}
    fn = (await (await client.get("/admin/v1/functions/echo", headers=dev_b)).json())["function"]
    stream = (await (await client.get("/serverless/v1/streams?stream=b-stream", headers=dev_b)).json())["streams"]
    queue = await (await client.get("/v2/echo/health", headers=user_b)).json()
    runs = {k: fn["status"][k] for k in ("revision", "invocations", "inflight")}
    return {"jobs": jobs, "function": {"tenant": fn["tenant"], "handler": fn["handler"], **runs},
            "stream": [{k: s[k] for k in ("produced", "retained", "last_id", "consumers")} for s in stream],
            "health": queue["jobs"]}


async def session_alive(client: Any) -> bool:
    """B's session is still open (B interrupting its own idle session: 200, nothing stopped)."""
    r = await client.post(f"/serverless/v1/functions/echo/sessions/{SESSION}/interrupt", headers=bearer("user-b"))
    return r.status == 200
