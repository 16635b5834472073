"""SIGTERM with its job store on a full disk (a 1 MB tmpfs): requests that wait on a job the drain
aborts — `/runsync`, a job's SSE stream, both running (not just IN_PROGRESS: that is said while
the job's start is being stored, which the full disk would fail) and followed before the signal —
are answered with the job as it is once the grace is spent, rather than held until aiohttp's own
shutdown timeout drops them (it took 23 s for a 10 s grace): the job stays IN_PROGRESS in the
store, the restart rules apply to it."""
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
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("sleeper", "job_fns.sleeper", concurrency=4, timeout=600),
                                                     fn("counter", "job_fns.acount", concurrency=4, timeout=600)]))
    server = start_server("--deploy-dir", str(deploy), "-s", f"jobs.path={tmpfs / 'jobs.sqlite3'}",
                          "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}",
                          "-s", "frontend.args.shutdownGraceSeconds=2")
    async with aiohttp.ClientSession() as s:
        async def runsync() -> tuple[int, dict]:
            async with s.post(f"{server.url}/v2/sleeper/runsync", json={"input": {"seconds": 3600}}) as r:
                return r.status, await r.json()

        waiting = asyncio.create_task(runsync())
        async with s.post(f"{server.url}/v2/counter/run", json={"input": {"n": 2, "delay": 3600}}) as r:
            job_id = (await r.json())["id"]
        stream = await s.get(f"{server.url}/v2/counter/stream/{job_id}", headers={"Accept": "text/event-stream"})
        assert stream.status == 200
        first = await stream.content.readuntil(b"\n\n")  # its first item: the job is being followed
        assert b"token-0" in first, first
        following = asyncio.create_task(stream.read())

        async def running() -> int:  # its invocation, so its start is stored (IN_PROGRESS comes before that)
            async with s.get(f"{server.url}/admin/v1/functions/sleeper") as r:
                return (await r.json())["function"]["status"]["inflight"]

        await eventually(running, "the /runsync job's handler running", accept=lambda n: n == 1)
        fill(tmpfs)
        server.proc.terminate()
        status, body = await waiting  # without the release: dropped, unanswered, after the grace
        assert status == 200 and body["status"] == "IN_PROGRESS", body
        rest = await following
        assert b"[DONE]" not in rest, rest  # not over: a client resumes it after the restart
        assert await asyncio.to_thread(server.proc.wait, 30) == 0
    log = server.stop()
    assert "did not stop" not in log and "Traceback" not in log, log
