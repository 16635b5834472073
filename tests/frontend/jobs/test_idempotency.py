"""`Idempotency-Key` on job submits, over real sockets: a repeated submit gets the first job
(same id, same answer shape, one execution), another body is 422 in the route's error shape,
keys are per tenant, they survive a kill -9, and concurrent submits with one key make one job.
The key stores themselves (claims, binds, expiry and purge, refusals) are the contract suite
tests/runtime/jobs/test_key_store_contract.py."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import yaml

from frontend.jobs import IDEMPOTENCY
from frontend.keys import REGISTRY
from runtime.jobs import idempotency
from runtime.jobs.idempotency import IdempotentSubmits
from runtime.jobs.key_store import MemoryKeys
from runtime.manifest import FunctionSpec
from tests.frontend.jobs.conftest import JOB_FUNCTIONS
from tests.support.servers import FUNCTIONS, HANDLERS
from tests.support.tenants import bearer

INVOKE = "/serverless/v1/functions/{}/invocations"
ASYNC = {"X-Invoke-Type": "async"}


def key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


async def jobs_of(client, function: str, headers: dict | None = None) -> list[dict]:
    resp = await client.get(f"/serverless/v1/jobs?function={function}", headers=headers or {})
    assert resp.status == 200, await resp.text()
    return (await resp.json())["jobs"]


async def test_runpod_run_and_runsync(jobs):
    body = {"input": {"a": 1, "b": [1, 2]}, "policy": {"ttl": 60000}}
    first = await jobs.post("/v2/echo-job/run", json=body, headers=key("k-run"))
    assert first.status == 200 and "Idempotent-Replayed" not in first.headers
    answer = await first.json()
    # the same body, another key order and spacing: the same request
    same = json.dumps({"policy": {"ttl": 60000}, "input": {"b": [1, 2], "a": 1}}, indent=2)
    again = await jobs.post("/v2/echo-job/run", data=same, headers={**key("k-run"), "Content-Type": "application/json"})
    assert again.status == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert await again.json() == answer == {"id": answer["id"], "status": "IN_QUEUE"}
    other = await jobs.post("/v2/echo-job/run", json={"input": {"a": 2}}, headers=key("k-run"))
    assert other.status == 422
    error = await other.json()
    assert list(error) == ["error"] and "Idempotency-Key" in error["error"]
    assert [j["id"] for j in await jobs_of(jobs, "echo-job")] == [answer["id"]]  # one execution

    sync = await jobs.post("/v2/echo-job/runsync", json={"input": {"s": 1}}, headers=key("k-sync"))
    result = await sync.json()
    assert result["status"] == "COMPLETED" and result["output"]["input"] == {"s": 1}
    replay = await jobs.post("/v2/echo-job/runsync", json={"input": {"s": 1}}, headers=key("k-sync"))
    assert replay.headers["Idempotent-Replayed"] == "true" and await replay.json() == result
    # the key names a /runsync request: /run with it is another request
    assert (await jobs.post("/v2/echo-job/run", json={"input": {"s": 1}}, headers=key("k-sync"))).status == 422
    assert len(await jobs_of(jobs, "echo-job")) == 2


async def test_openyuanrong_async(jobs):
    url = INVOKE.format("writer")
    first = await jobs.post(url, json={"n": 1}, headers={**ASYNC, **key('"quoted-key"')})
    assert first.status == 202
    request_id = (await first.json())["requestId"]
    again = await jobs.post(url, json={"n": 1}, headers={**ASYNC, **key("quoted-key")})  # the sf-string's value
    assert again.status == 202 and await again.json() == {"requestId": request_id}
    assert again.headers["X-Async-Request-Id"] == request_id and again.headers["Idempotent-Replayed"] == "true"
    for changed in ({"json": {"n": 2}, "headers": {}},
                    {"json": {"n": 1}, "headers": {"X-Webhook-Url": "https://hooks.example.com/x"}}):
        resp = await jobs.post(url, json=changed["json"], headers={**ASYNC, **key("quoted-key"), **changed["headers"]})
        assert resp.status == 422
        body = await resp.json()
        assert body["code"] == 200422 and "Idempotency-Key" in body["message"]
    # another function with the same key is another request too
    resp = await jobs.post(INVOKE.format("echo-job"), json={"n": 1}, headers={**ASYNC, **key("quoted-key")})
    assert resp.status == 422
    assert len(await jobs_of(jobs, "writer")) == 1


@pytest.mark.parametrize("bad", ["", '""', "x" * 256, "caf\u00e9"])
async def test_a_malformed_key_is_400(jobs, bad):
    resp = await jobs.post("/v2/echo-job/run", json={"input": {}}, headers={"Idempotency-Key": bad})
    assert resp.status == 400 and "Idempotency-Key" in (await resp.json())["error"]
    assert await jobs_of(jobs, "echo-job") == []


async def test_concurrent_submits_with_one_key_make_one_job(jobs):
    async with aiohttp.ClientSession() as s:  # separate connections, all at once
        base = str(jobs.make_url(""))

        async def submit() -> str:
            async with s.post(f"{base}/v2/sleeper/run", json={"input": {"seconds": 0.01}},
                              headers=key("burst")) as r:
                assert r.status == 200, await r.text()
                return (await r.json())["id"]

        ids = await asyncio.gather(*(submit() for _ in range(20)))
    assert len(set(ids)) == 1
    assert [j["id"] for j in await jobs_of(jobs, "sleeper")] == ids[:1]
    assert not jobs.server.app[IDEMPOTENCY]._locks  # nothing left behind per key


async def test_keys_are_per_tenant(make_client, job_config):
    tokens = [{"token": "user-a", "tenant": "acme", "role": "user"},
              {"token": "user-b", "tenant": "default", "role": "user"}]
    config = job_config(**{"auth.tokens": tokens})
    client = await make_client(config=config)
    admin_fn = {"name": "acme-echo", "handler": "job_fns.echo", "codePath": str(HANDLERS), "tenant": "acme"}
    await client.server.app[REGISTRY].adeploy([FunctionSpec.model_validate(admin_fn)])
    a = await client.post("/v2/acme-echo/run", json={"input": {}}, headers={**key("shared"), **bearer("user-a")})
    b = await client.post("/v2/echo-job/run", json={"input": {}}, headers={**key("shared"), **bearer("user-b")})
    assert a.status == b.status == 200, (await a.text(), await b.text())
    assert (await a.json())["id"] != (await b.json())["id"]
    assert "Idempotent-Replayed" not in b.headers


def restart_args(tmp_path) -> tuple[str, ...]:
    deploy = tmp_path / "deploy"
    deploy.mkdir(exist_ok=True)
    (deploy / "fns.yaml").write_text(yaml.safe_dump([f for f in JOB_FUNCTIONS if f["name"] == "echo-job"]))
    return ("--deploy-dir", str(deploy), "-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}",
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}")


async def test_a_key_survives_kill_9(start_server, tmp_path):
    args = restart_args(tmp_path)
    server = start_server(*args)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/v2/echo-job/run", json={"input": {"x": 1}}, headers=key("durable")) as r:
            job_id = (await r.json())["id"]
        server.kill()
        server = start_server(*args)
        async with s.post(f"{server.url}/v2/echo-job/run", json={"input": {"x": 1}}, headers=key("durable")) as r:
            assert r.status == 200 and r.headers["Idempotent-Replayed"] == "true"
            assert (await r.json())["id"] == job_id
        async with s.post(f"{server.url}/v2/echo-job/run", json={"input": {"x": 2}}, headers=key("durable")) as r:
            assert r.status == 422
        async with s.get(f"{server.url}/serverless/v1/jobs?function=echo-job") as r:
            assert [j["id"] for j in (await r.json())["jobs"]] == [job_id]


async def test_an_expired_key_names_no_job(make_client, job_config):
    client = await make_client(config=job_config(**{"jobs.idempotencySeconds": 0.05}))
    first = await (await client.post("/v2/echo-job/run", json={"input": {}}, headers=key("short"))).json()
    for _ in range(200):
        resp = await client.post("/v2/echo-job/run", json={"input": {}}, headers=key("short"))
        if "Idempotent-Replayed" not in resp.headers:
            break
        await asyncio.sleep(0.02)
    assert (await resp.json())["id"] != first["id"]


async def test_a_key_held_elsewhere_is_409_after_the_wait(monkeypatch):
    """A claim another node holds (its submit still being stored) is waited for, then 409."""
    monkeypatch.setattr(idempotency, "WAIT", 0.1)
    keys = MemoryKeys()
    assert await keys.claim("t", "k", "fp", 60) is None  # the other node's claim
    created = []

    async def create():
        created.append(1)
        raise AssertionError("never called")

    with pytest.raises(idempotency.IdempotencyConflictError):
        await IdempotentSubmits(keys, 60).submit("t", "k", "fp", create)
    assert created == []


async def test_a_failed_submit_frees_its_key(make_client, job_config):
    """413 (input over jobs.maxInputBytes) stores no job: the key is free for a corrected retry
    (which, held, would be 422: its body differs)."""
    client = await make_client(config=job_config(**{"jobs.maxInputBytes": 100}))
    resp = await client.post("/v2/echo-job/run", json={"input": "x" * 200}, headers=key("retry-me"))
    assert resp.status == 413
    resp = await client.post("/v2/echo-job/run", json={"input": "small"}, headers=key("retry-me"))
    assert resp.status == 200 and "Idempotent-Replayed" not in resp.headers


async def test_a_job_and_its_key_are_stored_together_or_not_at_all(start_server, tmp_path):
    """The job's row and its key's binding are one SQLite transaction: a store that refuses the
    bind (here a trigger; a kill -9 between two writes had the same effect) stores no job either.
    The submit is 507 and frees the key; before, the job was stored and ran while its key stayed
    claimed by nothing, so the client's retry waited and got 409, then (after a restart) a second job."""
    import sqlite3

    args = restart_args(tmp_path)
    server = start_server(*args)
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    db.execute("CREATE TRIGGER refuse_bind BEFORE UPDATE ON idempotency BEGIN "
               "SELECT RAISE(ABORT, 'database or disk is full'); END")
    db.commit()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/v2/echo-job/run", json={"input": {"x": 1}}, headers=key("together")) as r:
            assert r.status == 507, await r.text()
        async with s.get(f"{server.url}/serverless/v1/jobs?function=echo-job") as r:
            assert (await r.json())["jobs"] == []      # no job without its key
        db.execute("DROP TRIGGER refuse_bind")
        db.commit()
        async with s.post(f"{server.url}/v2/echo-job/run", json={"input": {"x": 1}}, headers=key("together")) as r:
            assert r.status == 200 and "Idempotent-Replayed" not in r.headers
            job_id = (await r.json())["id"]
        server.kill()
        server = start_server(*args)
        async with s.post(f"{server.url}/v2/echo-job/run", json={"input": {"x": 1}}, headers=key("together")) as r:
            assert r.status == 200 and r.headers["Idempotent-Replayed"] == "true"
            assert (await r.json())["id"] == job_id
        async with s.get(f"{server.url}/serverless/v1/jobs?function=echo-job") as r:
            assert [j["id"] for j in (await r.json())["jobs"]] == [job_id]
    db.close()
