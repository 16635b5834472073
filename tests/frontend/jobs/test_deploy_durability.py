"""Every change to deployments is stored before it is answered: POST, PUT of a manifest (what
`fnstream deploy` sends), PUT of one function and DELETE all come back after kill -9."""
from __future__ import annotations

import json

import aiohttp

from tests.frontend.jobs.test_jobs_durability import wait_status
from tests.support.servers import FUNCTIONS, HANDLERS, fn


async def test_a_deploy_of_a_manifest_survives_kill_9(start_server, tmp_path):
    args = ("-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}",
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}")
    server = start_server(*args)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/admin/v1/functions", json=fn("rv", "job_fns.echo", description="v1")) as r:
            assert r.status == 201, await r.text()
        manifest = [fn("rv", "job_fns.echo", description="v2"),
                    fn("pl", "job_fns.sleeper", concurrency=1)]
        async with s.put(f"{server.url}/admin/v1/functions", json=manifest) as r:
            assert r.status == 200, await r.text()
        ids = []
        for _ in range(3):
            async with s.post(f"{server.url}/v2/pl/run", json={"input": {"seconds": 0.2}}) as r:
                assert r.status == 200, await r.text()
                ids.append((await r.json())["id"])
        server.kill()  # SIGKILL: nothing is written at shutdown

        server = start_server(*args)
        async with s.get(f"{server.url}/admin/v1/functions/pl") as r:
            assert r.status == 200, await r.text()
        async with s.get(f"{server.url}/admin/v1/functions/rv") as r:
            assert (await r.json())["function"]["description"] == "v2"
        done = [await wait_status(s, server.url, "pl", j, {"COMPLETED", "FAILED", "CANCELLED"}) for j in ids]
        assert [b["status"] for b in done] == ["COMPLETED"] * 3
        # a redeploy of one function and a delete are stored too
        async with s.put(f"{server.url}/admin/v1/functions/rv", json=fn("rv", "job_fns.echo", description="v3")) as r:
            assert r.status == 200, await r.text()
        async with s.delete(f"{server.url}/admin/v1/functions/pl") as r:
            assert r.status == 200, await r.text()
        server.kill()

        server = start_server(*args)
        async with s.get(f"{server.url}/admin/v1/functions/rv") as r:
            assert (await r.json())["function"]["description"] == "v3"
        async with s.get(f"{server.url}/admin/v1/functions/pl") as r:
            assert r.status == 404


async def test_an_openyuanrong_registration_survives_kill_9(start_server, tmp_path):
    """POST /serverless/v1/functions (openYuanrong's JSON) goes through the same stored deploy."""
    args = ("-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}",
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS)])}")
    server = start_server(*args)
    body = {"name": "0@faaspy@hello3", "runtime": "python3.9", "kind": "faas", "handler": "echo.handler",
            "codePath": ".", "cpu": 600, "memory": 512, "timeout": 60, "concurrentNum": "2"}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/serverless/v1/functions", json=body) as r:
            assert r.status == 200, await r.text()
            urn = (await r.json())["function"]["functionVersionUrn"]
        server.kill()

        server = start_server(*args)
        async with s.get(f"{server.url}/serverless/v1/functions/0@faaspy@hello3") as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["function"]["concurrentNum"] == 2
        async with s.post(f"{server.url}/serverless/v1/functions/{urn}/invocations", json={"k": 1}) as r:
            assert await r.json() == {"k": 1}
        async with s.delete(f"{server.url}/serverless/v1/functions/0@faaspy@hello3") as r:
            assert r.status == 200, await r.text()
        server.kill()

        server = start_server(*args)
        async with s.get(f"{server.url}/serverless/v1/functions/0@faaspy@hello3") as r:
            assert r.status == 404, await r.text()
        server.kill()
