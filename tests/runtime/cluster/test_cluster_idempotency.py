"""Cluster mode: an `Idempotency-Key` is cluster-wide (Redis): the same key sent to two frontends
at once makes one job, and either frontend replays it."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import yaml

from tests.support.cluster import FAST
from tests.support.servers import FUNCTIONS, HANDLERS, fn


def node_args(url: str, deploy) -> list[str]:
    return ["--cluster", url, *FAST, "-s", "cluster.role=all", "--deploy-dir", str(deploy),
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}"]


async def test_one_job_per_key_across_frontends(redis_server, start_server, tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("echo", "job_fns.echo")]))
    a = start_server(*node_args(redis_server.url, deploy), env={"FNSTREAM_LOG": "WARNING"})
    b = start_server(*node_args(redis_server.url, deploy), env={"FNSTREAM_LOG": "WARNING"})
    async with aiohttp.ClientSession() as s:
        async def submit(base: str, body: dict) -> tuple[int, dict]:
            async with s.post(f"{base}/v2/echo/run", json=body, headers={"Idempotency-Key": "k1"}) as r:
                return r.status, await r.json()

        answers = await asyncio.gather(*(submit((a, b)[n % 2].url, {"input": {"n": 1}}) for n in range(16)))
        assert {status for status, _ in answers} == {200}, answers
        ids = {body["id"] for _, body in answers}
        assert len(ids) == 1, answers
        job_id = ids.pop()
        status, body = await submit(b.url, {"input": {"n": 2}})
        assert status == 422 and "Idempotency-Key" in body["error"]
        # the job ran once: a job of this id, and the key names it on both nodes after it ended
        for _ in range(200):
            async with s.get(f"{a.url}/v2/echo/status/{job_id}") as r:
                if (await r.json())["status"] == "COMPLETED":
                    break
            await asyncio.sleep(0.05)
        for base in (a.url, b.url):
            status, body = await submit(base, {"input": {"n": 1}})
            assert status == 200 and body["id"] == job_id
        keys = redis_server.client().keys("fnstream:idem:*")
        assert len(keys) == 1 and redis_server.client().pttl(keys[0]) > 0  # bounded: it expires
