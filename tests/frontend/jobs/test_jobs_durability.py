"""Durability: kill -9 a real `fnstream serve` with jobs queued and running, restart it on the same
store: every queued job runs, a running job with no output runs again, one with output is FAILED
saying the server restarted; functions deployed through the admin API come back."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import yaml

from tests.support.servers import FUNCTIONS, HANDLERS, fn


async def status(session: aiohttp.ClientSession, url: str, fn_name: str, job_id: str) -> dict:
    async with session.get(f"{url}/v2/{fn_name}/status/{job_id}") as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def wait_status(session, url, fn_name, job_id, want: set[str], timeout: float = 30) -> dict:
    for _ in range(int(timeout / 0.05)):
        body = await status(session, url, fn_name, job_id)
        if body["status"] in want:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{fn_name} job {job_id} never reached {want}: {body}")


async def test_kill_9_and_restart(start_server, tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([
        fn("queue", "job_fns.sleeper", concurrency=1),
        fn("streams", "job_fns.count", concurrency=1),
        fn("quiet", "job_fns.sync_sleeper", concurrency=1),
        fn("bundled", "job_fns.echo", description="from deployDir"),
    ]))
    args = ("--deploy-dir", str(deploy), "-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}",
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}")
    server = start_server(*args)
    async with aiohttp.ClientSession() as s:
        # functions deployed through the admin API: a new one, and a redeploy of a deployDir one
        extra = fn("added", "job_fns.echo")
        async with s.post(f"{server.url}/admin/v1/functions", json=extra) as r:
            assert r.status == 201, await r.text()
        async with s.put(f"{server.url}/admin/v1/functions/bundled",
                         json=fn("bundled", "job_fns.echo", description="from the admin API")) as r:
            assert r.status == 200, await r.text()

        async def run(fn_name: str, inp: dict) -> str:
            async with s.post(f"{server.url}/v2/{fn_name}/run", json={"input": inp}) as r:
                assert r.status == 200, await r.text()
                return (await r.json())["id"]

        streaming = await run("streams", {"n": 3, "delay": 30})   # writes one item, then waits
        quiet = await run("quiet", {"seconds": 1.5})               # runs, no output
        queued = [await run("queue", {"seconds": 0.05}) for _ in range(20)]
        blocker_ok = await wait_status(s, server.url, "queue", queued[0], {"IN_PROGRESS", "COMPLETED"})
        assert blocker_ok
        async with s.get(f"{server.url}/serverless/v1/jobs/{streaming}/events") as r:
            await r.content.readline()  # its first item is out
        await wait_status(s, server.url, "quiet", quiet, {"IN_PROGRESS"})
        added_job = None
        # a queued job of the admin-deployed function (it waits behind nothing: queue it last)
        added_job = await run("added", {"after": "restart"})
        server.kill()  # SIGKILL: no shutdown at all

        server = start_server(*args)
        finished = [await wait_status(s, server.url, "queue", j, {"COMPLETED", "FAILED", "CANCELLED"}) for j in queued]
        assert [b["status"] for b in finished] == ["COMPLETED"] * 20
        body = await wait_status(s, server.url, "streams", streaming, {"FAILED"})
        assert "server restarted" in body["error"] and "1 output item" in body["error"]
        async with s.get(f"{server.url}/serverless/v1/jobs/{streaming}") as r:
            shown = await r.json()
        assert shown["outputCount"] == 1 and shown["outputBytes"] > 0, shown  # its bytes were stored with it
        body = await wait_status(s, server.url, "quiet", quiet, {"COMPLETED"})
        assert body["output"] == "slept"
        body = await wait_status(s, server.url, "added", added_job, {"COMPLETED", "FAILED"})
        assert body["status"] == "COMPLETED" and body["output"]["input"] == {"after": "restart"}
        async with s.get(f"{server.url}/admin/v1/functions/bundled") as r:
            assert (await r.json())["function"]["description"] == "from the admin API"  # the stored one wins
        # a deleted function does not come back
        async with s.delete(f"{server.url}/admin/v1/functions/added") as r:
            assert r.status == 200
    server.stop()
    server = start_server(*args)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{server.url}/admin/v1/functions/added") as r:
            assert r.status == 404
        # finished jobs are still there after a clean restart
        assert (await status(s, server.url, "queue", queued[5]))["status"] == "COMPLETED"


async def test_a_second_server_on_the_same_store_is_refused(start_server, tmp_path):
    import pytest

    args = ("-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}")
    start_server(*args)
    with pytest.raises(RuntimeError) as info:
        start_server(*args)
    assert "in use by another fnstream server" in str(info.value)


async def test_sigterm_leaves_running_jobs_to_the_restart_rules(start_server, tmp_path):
    """A graceful stop lets jobs finish for shutdownGraceSeconds; one still running without output
    runs again at the next start, and queued ones run."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("quiet", "job_fns.sync_sleeper", concurrency=1)]))
    args = ("--deploy-dir", str(deploy), "-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}",
            "-s", "frontend.args.shutdownGraceSeconds=0.2",
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}")
    server = start_server(*args)
    async with aiohttp.ClientSession() as s:
        ids = []
        for seconds in (2, 0.1):
            async with s.post(f"{server.url}/v2/quiet/run", json={"input": {"seconds": seconds}}) as r:
                ids.append((await r.json())["id"])
        await wait_status(s, server.url, "quiet", ids[0], {"IN_PROGRESS"})
        server.stop()  # SIGTERM: the running job is aborted after the grace, the queued one never started
        server = start_server(*args)
        first = await wait_status(s, server.url, "quiet", ids[0], {"COMPLETED", "FAILED"})
        second = await wait_status(s, server.url, "quiet", ids[1], {"COMPLETED", "FAILED"})
        assert (first["status"], first["output"]) == ("COMPLETED", "slept")
        assert second["status"] == "COMPLETED"
