"""Cluster mode: an `Idempotency-Key` is cluster-wide (Redis): the same key sent to two frontends
at once makes one job, and either frontend replays it."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
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


async def test_a_job_and_its_key_never_part_when_a_node_dies_mid_submit(redis_server, monkeypatch):
    """Store level, two nodes on one Redis. The key's claim names its job's id and the job's save
    (one script on the job's slot) is the commit: a node killed right after that save leaves the
    key naming the job (the next request binds it), never a job without its key; a node that
    stalls past its claim's hold finds the key taken over and its late save refused, never a
    second job beside the taker's."""
    from runtime.cluster.job_store import connect_store
    from runtime.jobs.key_store import KeyBind, KeyClaimLostError, KeyRecord, key_digest
    from runtime.jobs.model import Job
    from tests.support.waiting import eventually

    a = connect_store(redis_server.url, "atomic", 60, 5)
    b = connect_store(redis_server.url, "atomic", 60, 5)
    await a.open()
    await b.open()
    keys_a, keys_b = a.idempotency_keys(3600), b.idempotency_keys(3600)
    try:
        # killed between the job's save and the key's bind
        assert await keys_a.claim("t", "k", "fp", 60) is None
        bind = KeyBind("t", "k", "fp", 3600, keys_a.reserve("t", "k", "fp"))

        async def killed(_bind: KeyBind) -> None:  # the node dies here: the bind never reaches Redis
            return None

        monkeypatch.setattr(keys_a, "bound", killed)
        await a.save(Job(id=bind.job_id, function="f", tenant="t", event={}), bind)
        assert await keys_b.claim("t", "k", "fp", 60) == KeyRecord("fp", bind.job_id)   # not "still pending"
        assert await keys_b.claim("t", "k", "other", 60) == KeyRecord("fp", bind.job_id)
        stored = json.loads(redis_server.client().get("atomic:idem:" + key_digest("t", "k")))
        assert stored["job"] == bind.job_id and redis_server.client().pttl("atomic:idem:" + key_digest("t", "k")) > 0

        # stalled past the claim's hold before its save: B takes the key, A's save is refused
        assert await keys_a.claim("t", "k2", "fp", 0.2) is None
        late = KeyBind("t", "k2", "fp", 3600, keys_a.reserve("t", "k2", "fp"))
        await eventually(lambda: keys_b.claim("t", "k2", "fp", 60), "B to take the key over once A's hold ran out",
                         accept=lambda record: record is None)
        taker = KeyBind("t", "k2", "fp", 3600, keys_b.reserve("t", "k2", "fp"))
        assert taker.job_id != late.job_id
        with pytest.raises(KeyClaimLostError):
            await a.save(Job(id=late.job_id, function="f", tenant="t", event={}), late)
        assert await b.fetch(late.job_id) is None
        await b.save(Job(id=taker.job_id, function="f", tenant="t", event={}), taker)
        assert await keys_a.claim("t", "k2", "fp", 60) == KeyRecord("fp", taker.job_id)
        assert len(redis_server.client().keys("atomic:idem:*")) == 2
    finally:
        await a.close()
        await b.close()
