"""SIGTERM with its job store on a full disk (a 1 MB tmpfs): requests that wait on a job the drain
aborts — `/runsync`, a job's SSE stream — are answered with the job as it is once the grace is
spent, rather than held until aiohttp's own shutdown timeout drops them (it took 23 s for a 10 s
grace): the job stays IN_PROGRESS in the store, the restart rules apply to it."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import yaml

from tests.frontend.jobs.test_store_failures import fill, tmpfs  # noqa: F401 (a fixture)
from tests.support.servers import FUNCTIONS, HANDLERS, fn
from tests.support.waiting import eventually


async def test_sigterm_on_a_full_disk_answers_the_requests_waiting_on_jobs(start_server, tmp_path, tmpfs):  # noqa: F811
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("sleeper", "job_fns.sleeper", concurrency=4,
                                                        timeout=600)]))
    server = start_server("--deploy-dir", str(deploy), "-s", f"jobs.path={tmpfs / 'jobs.sqlite3'}",
                          "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}",
                          "-s", "frontend.args.shutdownGraceSeconds=2")
    forever = {"input": {"seconds": 3600}}
    async with aiohttp.ClientSession() as s:
        async def runsync() -> tuple[int, dict]:
            async with s.post(f"{server.url}/v2/sleeper/runsync", json=forever) as r:
                return r.status, await r.json()

        async def events(job_id: str) -> bytes:
            async with s.get(f"{server.url}/v2/sleeper/stream/{job_id}",
                             headers={"Accept": "text/event-stream"}) as r:
                assert r.status == 200
                return await r.read()

        waiting = asyncio.create_task(runsync())
        async with s.post(f"{server.url}/v2/sleeper/run", json=forever) as r:
            job_id = (await r.json())["id"]
        following = asyncio.create_task(events(job_id))

        async def in_progress() -> int:
            async with s.get(f"{server.url}/v2/sleeper/health") as r:
                return (await r.json())["jobs"]["inProgress"]

        await eventually(in_progress, "both jobs running", accept=lambda n: n == 2)
        fill(tmpfs)
        server.proc.terminate()
        status, body = await waiting  # without the release: dropped, unanswered, after the grace
        assert status == 200 and body["status"] == "IN_PROGRESS", body
        stream = await following
        assert b"[DONE]" not in stream, stream  # not over: a client resumes it after the restart
        assert await asyncio.to_thread(server.proc.wait, 30) == 0
    log = server.stop()
    assert "did not stop" not in log and "Traceback" not in log, log
