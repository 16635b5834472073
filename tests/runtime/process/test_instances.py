"""Worker instances: many invocations per worker, scaling with load, the admin view and sessions."""
from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from frontend.keys import EXECUTOR
from runtime.executors import kind_named
from tests.support.servers import PROCESS_FUNCTIONS as PROC
from tests.support.waiting import eventually

SSE = {"Accept": "text/event-stream"}


@pytest.fixture
async def pclient(make_client):
    return await make_client(**{"runtime.codeRoots": [str(PROC)], "runtime.deployDir": None,
                                "frontend.args.enableEvent": True})


async def deploy(client, name: str, handler: str, **fields) -> dict:
    manifest = {"name": name, "handler": f"shared.{handler}", "codePath": ".", "executor": "process", **fields}
    resp = await client.post("/admin/v1/functions", data=json.dumps(manifest))
    body = await resp.json()
    assert resp.status == 201, body
    return body["function"]


async def pool_status(client, name: str) -> dict:
    resp = await client.get(f"/admin/v1/functions/{name}")
    return (await resp.json())["function"]["status"]["pool"]


async def wait_until(predicate, what: str, limit: float = 30.0):
    # [] (no instances) is an answer: only None and False mean "not yet".
    return await eventually(predicate, what, limit=limit, accept=lambda v: v is not None and v is not False)


async def wait_idle(client, name: str, count: int) -> list[int]:
    async def ready():
        instances = (await pool_status(client, name))["workers"]
        if len(instances) == count and all(w["state"] == "idle" for w in instances):
            return [w["pid"] for w in instances]
        return None
    return await wait_until(ready, f"{count} idle instance(s) of {name}")


async def invoke(client, name: str, event: dict, headers: dict | None = None):
    return await client.post(f"/serverless/v1/functions/{name}/invocations", json=event, headers=headers or {})


async def call(client, name: str, event: dict, headers: dict | None = None) -> tuple[int, dict]:
    resp = await invoke(client, name, event, headers)
    return resp.status, await resp.json()


def session(sid: str, ttl: float = 60, concurrency: int = 1) -> dict:
    return {"X-Instance-Session": json.dumps({"sessionID": sid, "sessionTTL": ttl, "concurrency": concurrency})}


# -- many invocations per instance --------------------------------------------------------------
async def test_200_async_invocations_run_at_once_on_2_instances(pclient):
    await deploy(pclient, "i-nap", "nap", instances=2, concurrency=300)
    await wait_idle(pclient, "i-nap", 2)
    started = time.monotonic()
    results = await asyncio.gather(*(call(pclient, "i-nap", {"seconds": 1}) for _ in range(200)))
    elapsed = time.monotonic() - started
    assert all(status == 200 for status, _ in results), results[:3]
    assert len({body["pid"] for _, body in results}) == 2
    assert elapsed < 20, elapsed  # one at a time per instance would take 100 s
    pool = await pool_status(pclient, "i-nap")
    assert pool["instanceConcurrency"] == 100
    assert sum(w["invocations"] for w in pool["workers"]) == 200 and pool["restarts"] == 0


async def test_def_handlers_share_a_worker_through_its_thread_pool(pclient, tmp_path):
    await deploy(pclient, "i-def", "rendezvous", instances=1, instanceConcurrency=3)
    await wait_idle(pclient, "i-def", 1)
    event = {"dir": str(tmp_path), "n": 3}
    results = await asyncio.gather(*(call(pclient, "i-def", event) for _ in range(3)))
    assert [status for status, _ in results] == [200] * 3
    assert all(body["met"] for _, body in results)        # all three ran at once ...
    assert len({body["pid"] for _, body in results}) == 1  # ... in one worker process
    assert (await pool_status(pclient, "i-def"))["instanceConcurrency"] == 3


async def test_def_default_is_one_invocation_per_worker(pclient, tmp_path):
    await deploy(pclient, "i-def1", "rendezvous", instances=1)
    await wait_idle(pclient, "i-def1", 1)
    event = {"dir": str(tmp_path), "n": 2, "limit": 0.5}
    results = await asyncio.gather(*(call(pclient, "i-def1", event) for _ in range(2)))
    assert sorted(body["met"] for _, body in results) == [False, True]  # the second waited for the first
    assert (await pool_status(pclient, "i-def1"))["instanceConcurrency"] == 1


async def test_a_worker_start_slower_than_the_functions_timeout_still_deploys(pclient):
    """The first worker's start (interpreter, then import) is not bounded by the function's
    `timeout`: an import of 0.5 s deploys a function whose calls may take 0.2 s, its worker up (it
    used to be refused, "did not finish importing the code within 0.2 s", as a busy host made a
    1.5 s one)."""
    manifest = {"name": "i-slowimp", "handler": "slow_import.handler", "codePath": ".", "executor": "process",
                "instances": 1, "timeout": 0.2}
    resp = await pclient.post("/admin/v1/functions", data=json.dumps(manifest))
    assert resp.status == 201, await resp.text()
    await wait_idle(pclient, "i-slowimp", 1)


async def test_async_timeout_cancels_only_that_invocation(pclient):
    # A busy host stalls a loop for a second or more: the quick call gets room within the timeout,
    # and the cancel all the time it needs (a kill would not be the handler stopping by itself).
    await deploy(pclient, "i-tmo", "nap", instances=1, timeout=4)
    pclient.app[EXECUTOR].runner(kind_named("process")).cancel_grace = 30
    (pid,) = await wait_idle(pclient, "i-tmo", 1)
    slow = asyncio.ensure_future(call(pclient, "i-tmo", {"seconds": 30}))
    quick = await call(pclient, "i-tmo", {"seconds": 0.3})
    status, body = await slow
    assert status == 504 and body["code"] == 4010 and "timed out" in body["message"]
    assert quick == (200, {"pid": pid})                 # its neighbour on the same worker finished
    assert await call(pclient, "i-tmo", {"seconds": 0}) == (200, {"pid": pid})
    assert (await pool_status(pclient, "i-tmo"))["restarts"] == 0  # the worker was not killed


async def test_a_def_handler_that_will_not_stop_takes_its_worker_and_says_so(pclient):
    await deploy(pclient, "i-stub", "stubborn_or_sleep", instances=1, instanceConcurrency=2)
    # (after the deploy, which imports the process kind: imported here first, on the loop, it was a
    # blocking call blockbuster refused whenever this test ran first in its pytest worker)
    pclient.app[EXECUTOR].runner(kind_named("process")).cancel_grace = 0.3
    (pid,) = await wait_idle(pclient, "i-stub", 1)
    neighbour = asyncio.ensure_future(call(pclient, "i-stub", {"seconds": 30}))
    resp = await invoke(pclient, "i-stub", {"stubborn": True}, SSE)
    assert b"started" in await resp.content.readuntil(b"started")
    resp.close()  # the client leaves: cancel, which the handler ignores
    status, body = await asyncio.wait_for(neighbour, 20)  # never a hang
    assert status == 500 and body["code"] == 4001, body
    assert f"(pid {pid}) was killed" in body["message"] and "did not stop within 0.3 s" in body["message"]
    (new_pid,) = await wait_idle(pclient, "i-stub", 1)
    assert new_pid != pid and (await pool_status(pclient, "i-stub"))["restarts"] == 1
    assert (await call(pclient, "i-stub", {"seconds": 0}))[0] == 200


async def test_a_crash_fails_every_invocation_on_that_worker_only(pclient):
    await deploy(pclient, "i-crash", "remember", instances=1)
    (pid,) = await wait_idle(pclient, "i-crash", 1)
    waiting = [asyncio.ensure_future(call(pclient, "i-crash", {"seconds": 30})) for _ in range(3)]

    async def all_running():
        return (await pool_status(pclient, "i-crash"))["workers"][0]["busySlots"] == 3
    await wait_until(all_running, "three invocations on the worker")
    status, body = await call(pclient, "i-crash", {"crash": True})
    assert status == 500 and "exited with code 9" in body["message"]
    for status, body in await asyncio.gather(*waiting):
        assert status == 500 and f"the worker process (pid {pid}) exited with code 9" in body["message"]
    assert (await call(pclient, "i-crash", {}))[0] == 200


# -- scaling -------------------------------------------------------------------------------------
async def test_scale_from_zero_up_to_max_and_back_to_zero(pclient, tmp_path):
    body = await deploy(pclient, "i-scale", "rendezvous", minInstances=0, maxInstances=2,
                        scaleDownIdleSeconds=0.5)
    assert body["status"]["kind"] == "sync"  # a worker imported the code even with minInstances 0
    await wait_idle(pclient, "i-scale", 0)   # ... then left: scaled to zero
    (tmp_path / "a").mkdir()
    status, first = await call(pclient, "i-scale", {"dir": str(tmp_path / "a"), "n": 1})
    assert status == 200 and first["met"]
    pool = await pool_status(pclient, "i-scale")
    assert pool["coldStarts"] == 1 and pool["minInstances"] == 0 and pool["maxInstances"] == 2
    (tmp_path / "b").mkdir()
    event = {"dir": str(tmp_path / "b"), "n": 2, "limit": 20}
    results = await asyncio.gather(*(call(pclient, "i-scale", event) for _ in range(2)))
    assert all(status == 200 and body["met"] for status, body in results), results  # a second worker came
    assert len({body["pid"] for _, body in results}) == 2
    await wait_idle(pclient, "i-scale", 0)  # both idle longer than scaleDownIdleSeconds: gone again
    assert (await pool_status(pclient, "i-scale"))["restarts"] == 0


async def test_scale_to_zero_still_refuses_code_that_does_not_import(pclient):
    manifest = {"name": "i-bad", "handler": "shared.no_such_handler", "codePath": ".", "executor": "process",
                "minInstances": 0}
    resp = await pclient.post("/admin/v1/functions", data=json.dumps(manifest))
    body = await resp.json()
    assert resp.status == 400 and "no_such_handler" in body["message"], body


async def test_admin_shows_each_instance(pclient):
    await deploy(pclient, "i-admin", "nap", instances=2, instanceConcurrency=10)
    await wait_idle(pclient, "i-admin", 2)
    running = asyncio.ensure_future(call(pclient, "i-admin", {"seconds": 2}))

    async def busy():
        pool = await pool_status(pclient, "i-admin")
        return pool if any(w["busySlots"] == 1 for w in pool["workers"]) else None
    pool = await wait_until(busy, "a busy slot")
    assert {"pid", "state", "busySlots", "slots", "startedAt", "invocations", "sessions"} <= set(pool["workers"][0])
    assert pool["instanceConcurrency"] == 10 and all(w["slots"] == 10 for w in pool["workers"])
    assert sorted(w["state"] for w in pool["workers"]) == ["busy", "idle"]
    assert all(w["startedAt"] <= time.time() for w in pool["workers"])
    assert (await running)[0] == 200
    pool = await pool_status(pclient, "i-admin")
    assert sum(w["invocations"] for w in pool["workers"]) == 1


@pytest.mark.parametrize("fields, message", [
    ({"instances": 2, "minInstances": 1}, "not both"),
    ({"minInstances": 3, "maxInstances": 2}, "must not exceed"),
    ({"instanceConcurrency": 0}, "instanceConcurrency"),
    ({"minInstances": -1}, "minInstances"),
    ({"scaleDownIdleSeconds": 0}, "scaleDownIdleSeconds"),
])
async def test_bad_instance_fields_are_refused(pclient, fields, message):
    manifest = {"name": "i-bad", "handler": "shared.nap", "codePath": ".", "executor": "process", **fields}
    resp = await pclient.post("/admin/v1/functions", data=json.dumps(manifest))
    body = await resp.json()
    assert resp.status == 400 and message in body["message"], body


# -- sessions ------------------------------------------------------------------------------------
async def test_a_session_keeps_its_instance_and_its_state(pclient):
    await deploy(pclient, "i-sess", "remember", instances=2)
    await wait_idle(pclient, "i-sess", 2)
    pids = set()
    for turn in range(1, 6):
        # Unpinned load beside it, so the least-loaded choice would move the session if it were not pinned.
        load = [asyncio.ensure_future(call(pclient, "i-sess", {"seconds": 0.3})) for _ in range(turn % 3)]
        status, body = await call(pclient, "i-sess", {"say": turn}, session("conv-1"))
        assert status == 200 and body["turns"] == list(range(1, turn + 1)) and not body["restarted"], body
        pids.add(body["pid"])
        await asyncio.gather(*load)
    assert len(pids) == 1
    status, other = await call(pclient, "i-sess", {"say": "x"}, session("conv-2"))
    assert status == 200 and other["turns"] == ["x"]
    fn = (await (await pclient.get("/admin/v1/functions/i-sess")).json())["function"]
    listed = {s["sessionID"]: s for s in fn["status"]["sessions"]}
    assert listed["conv-1"]["pid"] == pids.pop() and listed["conv-1"]["turns"] == 5
    assert sum(w["sessions"] for w in fn["status"]["pool"]["workers"]) == 2


@pytest.mark.parametrize("limit, peak", [(1, 1), (2, 2)])
async def test_a_session_runs_at_most_its_concurrency_at_once(pclient, limit, peak):
    await deploy(pclient, "i-conc", "remember", instances=1)
    await wait_idle(pclient, "i-conc", 1)
    results = await asyncio.gather(*(call(pclient, "i-conc", {"seconds": 1}, session("s", concurrency=limit))
                                     for _ in range(3)))
    assert all(status == 200 for status, _ in results)
    assert max(body["peak"] for _, body in results) == peak


@pytest.mark.parametrize("value, message", [
    ("{not json", "not JSON"),
    ("[1]", "JSON object"),
    (json.dumps({"sessionID": "x" * 64}), "at most 63"),
    (json.dumps({"sessionID": ""}), "non-empty"),
    (json.dumps({"sessionID": "a", "sessionTTL": 0}), "sessionTTL"),
    (json.dumps({"sessionID": "a", "sessionTTL": "long"}), "sessionTTL"),
    (json.dumps({"sessionID": "a", "sessionTTL": 10 ** 9}), "sessionTTL"),
    (json.dumps({"sessionID": "a", "concurrency": 0}), "concurrency"),
    (json.dumps({"sessionID": "a", "colour": "red"}), "unknown field"),
])
async def test_bad_session_headers_are_400(pclient, value, message):
    await deploy(pclient, "i-hdr", "remember", instances=1)
    status, body = await call(pclient, "i-hdr", {}, {"X-Instance-Session": value})
    assert status == 400 and body["code"] == 200400 and message in body["message"], body
    assert (await pool_status(pclient, "i-hdr"))["workers"][0]["invocations"] == 0


async def test_interrupt_ends_the_running_stream_with_an_error_event(pclient):
    await deploy(pclient, "i-int", "chatter", instances=1)
    (pid,) = await wait_idle(pclient, "i-int", 1)
    resp = await invoke(pclient, "i-int", {}, {**SSE, **session("talk")})
    assert resp.status == 200
    assert (await resp.content.readline()).startswith(b"id: 1")
    url = "/serverless/v1/functions/i-int/sessions/talk"
    answer = await pclient.post(url + "/interrupt")
    assert answer.status == 200 and (await answer.json())["interrupted"] == 1
    rest = (await asyncio.wait_for(resp.text(), 10)).splitlines()
    data = [line[6:] for line in rest if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])
    assert error["code"] == 4001 and "interrupted" in error["message"], error
    # The worker lives on (the async handler stopped), and the session can take its next turn.
    assert (await pool_status(pclient, "i-int"))["restarts"] == 0
    assert (await pclient.delete(url)).status == 200
    assert (await pclient.delete(url)).status == 404
    assert (await pclient.post(url + "/interrupt")).status == 404
    assert (await pclient.post("/serverless/v1/functions/nope/sessions/talk/interrupt")).status == 404
    assert (await pool_status(pclient, "i-int"))["workers"][0]["pid"] == pid


async def test_a_session_whose_instance_died_continues_and_is_told(pclient):
    await deploy(pclient, "i-rs", "remember", instances=1)
    (pid,) = await wait_idle(pclient, "i-rs", 1)
    status, body = await call(pclient, "i-rs", {"say": 1}, session("again"))
    assert status == 200 and body["pid"] == pid and not body["restarted"]
    status, body = await call(pclient, "i-rs", {"crash": True}, session("again"))
    assert status == 500 and "exited with code 9" in body["message"]
    status, body = await call(pclient, "i-rs", {"say": 2}, session("again"))
    assert status == 200 and body["pid"] != pid and body["restarted"] and body["turns"] == [2], body
    status, body = await call(pclient, "i-rs", {"say": 3}, session("again"))
    assert status == 200 and not body["restarted"] and body["turns"] == [2, 3]  # told once


async def test_a_session_expires_after_its_ttl(pclient):
    await deploy(pclient, "i-ttl", "remember", instances=1)
    assert (await call(pclient, "i-ttl", {"say": 1}, session("brief", ttl=0.3)))[0] == 200
    await asyncio.sleep(0.6)
    assert (await pclient.delete("/serverless/v1/functions/i-ttl/sessions/brief")).status == 404


async def test_sessions_are_accepted_by_in_process_executors(pclient):
    manifest = {"name": "i-local", "handler": "shared.remember", "codePath": "."}
    assert (await pclient.post("/admin/v1/functions", data=json.dumps(manifest))).status == 201
    for turn in (1, 2):
        status, body = await call(pclient, "i-local", {"say": turn}, session("here"))
        assert status == 200 and body["pid"] == os.getpid() and body["session"] == "here"
    results = await asyncio.gather(*(call(pclient, "i-local", {"seconds": 0.5}, session("here"))
                                     for _ in range(2)))
    assert max(body["peak"] for _, body in results) == 1  # its concurrency (1) holds in process too
    resp = await invoke(pclient, "i-local", {}, session("bad") | {"X-Instance-Session": "{"})
    assert resp.status == 400
    assert (await pclient.delete("/serverless/v1/functions/i-local/sessions/here")).status == 200


async def test_an_exclusive_session_keeps_other_invocations_off_its_instance(pclient):
    await deploy(pclient, "i-excl", "remember", instances=2)
    await wait_idle(pclient, "i-excl", 2)
    status, mine = await call(pclient, "i-excl", {"say": 1}, session("solo", concurrency=-1))
    assert status == 200
    others = await asyncio.gather(*(call(pclient, "i-excl", {"seconds": 0.2}) for _ in range(4)))
    assert all(status == 200 and body["pid"] != mine["pid"] for status, body in others)
    status, again = await call(pclient, "i-excl", {"say": 2}, session("solo", concurrency=-1))
    assert status == 200 and again["pid"] == mine["pid"] and again["turns"] == [1, 2]
    assert (await pclient.delete("/serverless/v1/functions/i-excl/sessions/solo")).status == 200
    freed = await asyncio.gather(*(call(pclient, "i-excl", {"seconds": 0.5}) for _ in range(20)))
    assert mine["pid"] in {body["pid"] for _, body in freed}  # ended: the instance is shared again


async def test_an_exclusive_session_never_starves_the_functions_other_callers(pclient):
    # A day-long exclusive session on a one-instance function would lock everyone else out: refused.
    await deploy(pclient, "i-hog1", "remember", instances=1)
    status, body = await call(pclient, "i-hog1", {"say": 1}, session("hog", ttl=86400, concurrency=-1))
    assert status == 429 and "maxInstances" in body["message"]
    resp = await pclient.get("/admin/v1/functions/i-hog1")
    assert (await resp.json())["function"]["status"]["sessions"] == []  # refused: it left no entry
    assert (await pclient.delete("/serverless/v1/functions/i-hog1/sessions/hog")).status == 404
    status, _ = await call(pclient, "i-hog1", {"say": 1})
    assert status == 200
    # With 3 instances exclusive sessions own at most 2: the third hog is refused at once, and
    # everyone else is still served by the instance that stays shared.
    await deploy(pclient, "i-hog3", "remember", minInstances=1, maxInstances=3)
    pids = set()
    for hog in ("a", "b"):
        status, body = await call(pclient, "i-hog3", {"say": 1}, session(hog, ttl=86400, concurrency=-1))
        assert status == 200
        pids.add(body["pid"])
    status, body = await call(pclient, "i-hog3", {"say": 1}, session("c", ttl=86400, concurrency=-1))
    assert status == 429 and "at most 2" in body["message"]
    others = await asyncio.gather(*(call(pclient, "i-hog3", {"seconds": 0.1}) for _ in range(4)))
    assert all(status == 200 and body["pid"] not in pids for status, body in others)
    assert (await pclient.delete("/serverless/v1/functions/i-hog3/sessions/a")).status == 200
    status, _ = await call(pclient, "i-hog3", {"say": 1}, session("c", ttl=86400, concurrency=-1))
    assert status == 200  # a share given back is taken again


async def test_sessions_carry_over_a_redeploy_and_are_told(pclient):
    await deploy(pclient, "i-redeploy", "remember", instances=1)
    status, before = await call(pclient, "i-redeploy", {"say": 1}, session("keep"))
    assert status == 200 and not before["restarted"]
    manifest = {"name": "i-redeploy", "handler": "shared.remember", "codePath": ".", "executor": "process",
                "instances": 1}
    assert (await pclient.put("/admin/v1/functions/i-redeploy", data=json.dumps(manifest))).status == 200
    status, after = await call(pclient, "i-redeploy", {"say": 2}, session("keep"))
    assert status == 200 and after["restarted"] and after["turns"] == [2] and after["pid"] != before["pid"]


async def test_async_writes_on_a_shared_worker_arrive_while_it_runs(pclient):
    await deploy(pclient, "i-live", "chatter", instances=1)
    await wait_idle(pclient, "i-live", 1)
    started = time.monotonic()
    resp = await invoke(pclient, "i-live", {}, SSE)
    arrivals = []
    while len(arrivals) < 6:
        line = await resp.content.readline()
        if line.startswith(b"data: "):
            arrivals.append(time.monotonic() - started)
    resp.close()
    # One write every 50 ms: events trickle in one by one, not in a burst at the end.
    assert arrivals[-1] - arrivals[0] >= 0.2, arrivals


async def test_a_slow_client_holds_back_only_its_own_invocation(make_client):
    client = await make_client(**{"runtime.codeRoots": [str(PROC)], "runtime.deployDir": None,
                                  "frontend.args.streamBufferEvents": 2})
    await deploy(client, "i-slow", "flood", instances=1)
    await wait_idle(client, "i-slow", 1)
    stalled = await invoke(client, "i-slow", {"count": 2000, "size": 100_000}, SSE)  # 200 MB, never read
    assert stalled.status == 200
    await stalled.content.readline()

    async def backed_up():  # its writes filled the socket, the channel and the credits
        return (await pool_status(client, "i-slow"))["workers"][0]["busySlots"] == 1
    await wait_until(backed_up, "the stalled stream")
    await asyncio.sleep(0.5)
    resp = await invoke(client, "i-slow", {"count": 200, "size": 10}, SSE)  # a neighbour on the same worker
    text = await asyncio.wait_for(resp.text(), 20)
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    assert len(events) == 202 and events[-2] == 'data: "done"' and events[-1] == "data: [DONE]"
    rest = await asyncio.wait_for(stalled.text(), 60)  # and the stalled one still loses nothing
    assert rest.count("x" * 100_000) == 2000 and rest.rstrip().endswith("data: [DONE]")


async def test_an_expired_exclusive_session_frees_its_instance(pclient):
    await deploy(pclient, "i-excl-ttl", "remember", instances=2)
    await wait_idle(pclient, "i-excl-ttl", 2)
    status, mine = await call(pclient, "i-excl-ttl", {"say": 1}, session("brief", ttl=0.3, concurrency=-1))
    assert status == 200
    await asyncio.sleep(0.6)  # no request names the session again: it lapses on its own
    freed = await asyncio.gather(*(call(pclient, "i-excl-ttl", {"seconds": 0.5}) for _ in range(20)))
    assert mine["pid"] in {body["pid"] for _, body in freed}
