"""Issue 24 B: what the node accepted under `runtime.maxWorkerProcesses` comes back after kill -9,
whichever tenant deployed it first: every process function holds a worker from its deploy on, so
one tenant's deploys cannot leave another's stored function without room at restart. What still
cannot fit then (a lower cap) is said loudly and stays stored."""
from __future__ import annotations

import json

import aiohttp

from tests.support.servers import PROCESS_FUNCTIONS as PROC

FUNCS = "/admin/v1/functions"
TOKENS = [{"token": "dev-ta", "tenant": "ta", "role": "developer"},
          {"token": "dev-tb", "tenant": "tb", "role": "developer"}]


def manifest(name: str, **fields: object) -> dict:
    return {"name": name, "handler": "shared.nap", "codePath": ".", "executor": "process",
            "scaleDownIdleSeconds": 600, **fields}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_scale_to_zero_function_comes_back_after_kill_9_under_a_full_cap(start_server, tmp_path):
    def args(cap: int) -> tuple[str, ...]:
        return ("-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}", "-s", f"runtime.codeRoots={json.dumps([str(PROC)])}",
                "-s", "runtime.deployDir=null", "-s", f"auth.tokens={json.dumps(TOKENS)}",
                "-s", f"runtime.maxWorkerProcesses={cap}")

    server = start_server(*args(2))
    async with aiohttp.ClientSession() as s:
        async def put(name: str, token: str, **fields: object) -> int:
            async with s.put(f"{server.url}{FUNCS}", json=[manifest(name, **fields)],
                             headers=bearer(token)) as r:
                return r.status

        assert await put("lazy", "dev-tb", minInstances=0) == 200
        assert await put("w1", "dev-ta", minInstances=1) == 200
        assert await put("w2", "dev-ta", minInstances=1) == 429  # lazy holds the other worker
        server.kill()  # SIGKILL: nothing is written at shutdown

        server = start_server(*args(2))
        for name, token in (("lazy", "dev-tb"), ("w1", "dev-ta")):
            async with s.post(f"{server.url}/serverless/v1/functions/{name}/invocations", json={"seconds": 0},
                              headers=bearer(token)) as r:
                assert r.status == 200, (name, await r.text())
        server.kill()

        # A cap lowered below what was accepted: one cannot come back; it is said, and kept stored.
        server = start_server(*args(1))
        lost = [name for name, token in (("lazy", "dev-tb"), ("w1", "dev-ta"))
                if (await s.get(f"{server.url}{FUNCS}/{name}", headers=bearer(token))).status == 404]
        assert len(lost) == 1, lost
        server.kill()
        assert "could not be deployed again" in server.output() and "kept" in server.output()

        server = start_server(*args(2))
        for name, token in (("lazy", "dev-tb"), ("w1", "dev-ta")):
            async with s.get(f"{server.url}{FUNCS}/{name}", headers=bearer(token)) as r:
                assert r.status == 200, (name, await r.text())
