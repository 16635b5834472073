"""Cluster mode: a retry of a FAILED job works through any frontend (issue #28). The retrying node
takes the job over in one Redis script, runs it once, and the node that ran it before forgets its
copy and never deletes the job another node took."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import yaml

from tests.support.cluster import FAST
from tests.support.servers import FUNCTIONS, HANDLERS, fn
from tests.support.waiting import eventually


def node_args(url: str, deploy) -> list[str]:
    return ["--cluster", url, *FAST, "-s", "cluster.role=all", "--deploy-dir", str(deploy),
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}"]


async def status(s, base: str, job_id: str) -> dict:
    async with s.get(f"{base}/v2/flaky/status/{job_id}") as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def failed_job(s, base: str, path) -> str:
    async with s.post(f"{base}/v2/flaky/run", json={"input": {"path": str(path)}}) as r:
        assert r.status == 200, await r.text()
        job_id = (await r.json())["id"]
    await eventually(lambda: _is(s, base, job_id, "FAILED"), "the job's first run to fail")
    return job_id


async def _is(s, base: str, job_id: str, want: str) -> bool:
    return (await status(s, base, job_id))["status"] == want


async def test_a_job_failed_on_one_node_is_retried_through_another(redis_server, start_server, tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("flaky", "job_fns.fails_once")]))
    a = start_server(*node_args(redis_server.url, deploy))
    b = start_server(*node_args(redis_server.url, deploy))
    async with aiohttp.ClientSession() as s:
        runs = tmp_path / "runs-1"
        job_id = await failed_job(s, a.url, runs)
        async with s.post(f"{b.url}/v2/flaky/retry/{job_id}") as r:
            assert r.status == 200, await r.text()
            assert await r.json() == {"id": job_id, "status": "IN_QUEUE"}
        for base in (b.url, a.url):
            await eventually(lambda base=base: _is(s, base, job_id, "COMPLETED"), "the retry to complete")
            body = await status(s, base, job_id)
            assert body["output"] == {"runs": 2} and body["retries"] == 1
        assert runs.read_text().count("run") == 2  # once, and once again

        # two retries at once, through A (which ran it) and B: one runs it, the other is 409
        runs = tmp_path / "runs-2"
        job_id = await failed_job(s, a.url, runs)

        async def retry(base: str) -> tuple[int, dict]:
            async with s.post(f"{base}/v2/flaky/retry/{job_id}") as r:
                return r.status, await r.json()

        answers = await asyncio.gather(retry(a.url), retry(b.url), retry(a.url), retry(b.url))
        assert sorted(code for code, _ in answers) == [200, 409, 409, 409], answers
        assert [body for code, body in answers if code == 200] == [{"id": job_id, "status": "IN_QUEUE"}]
        assert all("only a FAILED or TIMED_OUT job can be retried" in body["error"]
                   for code, body in answers if code == 409), answers
        for base in (a.url, b.url):
            await eventually(lambda base=base: _is(s, base, job_id, "COMPLETED"), "the retry to complete")
            assert (await status(s, base, job_id))["retries"] == 1
        async with s.post(f"{b.url}/v2/flaky/retry/{job_id}") as r:   # COMPLETED now: 409 as ever
            assert r.status == 409
        assert runs.read_text().count("run") == 2


async def test_the_former_owner_forgets_a_taken_job_and_never_deletes_it(redis_server):
    """Store level: B's retry of A's FAILED job takes it in one script; A hears of it (and drops its
    copy), and A's expiry delete of the job is refused; of two retries at once one takes it."""
    from runtime.cluster.job_store import connect_store
    from runtime.jobs.model import Job

    a = connect_store(redis_server.url, "retake", 60, 5)
    b = connect_store(redis_server.url, "retake", 60, 5)
    told: list[str] = []
    a.on_refused = told.append
    await a.open()
    await b.open()
    try:
        await asyncio.sleep(0)
        failed = Job(id="j1", function="f", tenant="t", event={"x": 1}, status="FAILED", completed_at=time.time(),
                     invocation_id="inv-1")
        await a.save(failed)
        await a.add_outputs("j1", 1, ["half"])
        seen = await b.fetch("j1")
        assert seen is not None and seen.status == "FAILED" and seen.outputs == ["half"]
        seen.remote = True

        def again(job: Job, inv: str) -> Job:
            return Job(id=job.id, function=job.function, tenant=job.tenant, event=job.event, status="IN_QUEUE",
                       retried=job.retried + 1, invocation_id=inv)

        assert await b.retake(seen, again(seen, "inv-b"))
        stored = await b.fetch("j1")
        assert stored is not None and stored.status == "IN_QUEUE" and stored.retried == 1 and stored.outputs == []
        assert stored.invocation_id == "inv-b"
        assert redis_server.client().get("retake:{job:j1}:owner") == b.node
        assert redis_server.client().ttl("retake:{job:j1}:state") == -1   # unfinished again: kept
        await eventually(lambda: told == ["j1"], "A to hear that B took its job")
        await a.delete(["j1"])                 # A's expiry of the job it held: refused, it is B's now
        assert (await b.fetch("j1")) is not None
        assert not await a.retake(failed, again(failed, "inv-late"))   # retried already: refused
        assert told == ["j1", "j1"]            # ... and forgotten here, whether or not the message came
        await b.delete(["j1"])
        assert (await b.fetch("j1")) is None

        # A's own job whose end is not stored yet (Redis has it running): refused, and still A's
        running = Job(id="j3", function="f", tenant="t", event={}, status="IN_PROGRESS")
        await a.save(running)
        ended = Job(id="j3", function="f", tenant="t", event={}, status="FAILED", completed_at=time.time())
        assert not await a.retake(ended, again(ended, "inv-a"))
        assert told == ["j1", "j1"] and (await b.fetch("j3")).status == "IN_PROGRESS"

        # A's own retry racing B's: exactly one takes it
        failed = Job(id="j2", function="f", tenant="t", event={}, status="TIMED_OUT", completed_at=time.time())
        await a.save(failed)
        seen = await b.fetch("j2")
        assert seen is not None
        seen.remote = True
        took = await asyncio.gather(b.retake(seen, again(seen, "inv-b")), a.retake(failed, again(failed, "inv-a")))
        assert sorted(took) == [False, True]
        stored = await b.fetch("j2")
        assert stored is not None and stored.invocation_id == ("inv-b" if took[0] else "inv-a")
        assert redis_server.client().get("retake:{job:j2}:owner") == (b if took[0] else a).node
    finally:
        await a.close()
        await b.close()
