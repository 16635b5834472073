"""The process executor: handlers in worker processes, isolated, parallel, with hard limits.

Each hard-limit failure has one test, and after each the next invocation must succeed.
"""
from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest

from frontend.keys import EXECUTOR
from runtime.executors import kind_named
from tests.support.servers import FUNCTIONS, PROCESS_FUNCTIONS, assert_live
from tests.support.waiting import eventually

PROC = PROCESS_FUNCTIONS

SSE = {"Accept": "text/event-stream"}


@pytest.fixture
async def pclient(make_client):
    """An in-process client whose code root is tests/process_functions and nothing deployed."""
    return await make_client(**{"runtime.codeRoots": [str(PROC), str(FUNCTIONS)], "runtime.deployDir": None})


async def deploy(client, name: str, handler: str, **fields) -> dict:
    manifest = {"name": name, "handler": f"proc.{handler}", "codePath": ".", "executor": "process",
                "instances": 1, **fields}
    resp = await client.post("/admin/v1/functions", data=json.dumps(manifest))
    body = await resp.json()
    assert resp.status == 201, body
    return body["function"]


async def pool_status(client, name: str) -> dict:
    resp = await client.get(f"/admin/v1/functions/{name}")
    return (await resp.json())["function"]["status"]["pool"]


async def wait_until(predicate, what: str, limit: float = 20.0):
    """Poll an async predicate until it returns something truthy (a bounded wait, not a timing check)."""
    return await eventually(predicate, what, limit=limit)


def process_gone(pid: int):
    """A wait_until predicate: the process has exited and been reaped."""
    async def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return gone


async def wait_ready(client, name: str) -> list[int]:
    async def ready():
        pool = await pool_status(client, name)
        workers = pool["workers"]
        if pool["instances"] == len(workers) >= max(1, pool["minInstances"]) \
                and all(w["state"] == "idle" for w in workers):
            return [w["pid"] for w in workers]
        return None
    return await wait_until(ready, f"the workers of {name}")


async def invoke(client, name: str, event: dict, headers: dict | None = None):
    return await client.post(f"/serverless/v1/functions/{name}/invocations", json=event, headers=headers or {})


async def call_ok(client, name: str, event: dict) -> dict:
    resp = await invoke(client, name, event)
    body = await resp.json()
    assert resp.status == 200, body
    return body


def parse_sse(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


# -- basics ------------------------------------------------------------------------------------
async def test_runs_in_a_worker_with_initializer_once_per_process(pclient):
    await deploy(pclient, "p-pid", "pid", initializer="proc.init")
    pids = await wait_ready(pclient, "p-pid")
    first = await call_ok(pclient, "p-pid", {"a": 1})
    second = await call_ok(pclient, "p-pid", {"a": 2})
    assert first["pid"] == second["pid"] == pids[0] != os.getpid()
    assert first["init_pid"] == first["pid"]  # the initializer ran in the worker itself
    assert second["echo"] == {"a": 2}
    pool = await pool_status(pclient, "p-pid")
    assert pool["workers"][0]["invocations"] == 2 and pool["restarts"] == 0


async def test_generator_and_async_handlers(pclient):
    await deploy(pclient, "p-gen", "gen")
    await deploy(pclient, "p-async", "aticker")
    assert await call_ok(pclient, "p-gen", {"count": 3}) == [{"i": 0}, {"i": 1}, {"i": 2}]
    resp = await invoke(pclient, "p-async", {"count": 3, "delay_ms": 10}, SSE)
    events = parse_sse(await resp.text())
    assert [json.loads(e)["tick"] for e in events[:3]] == [1, 2, 3]
    assert json.loads(events[3])["pid"] != os.getpid() and events[-1] == "[DONE]"


@pytest.mark.parametrize("manifest, message", [
    ({"handler": "proc.pid", "executor": "async"}, "'async' needs an `async def` handler"),
    ({"handler": "proc.aticker", "executor": "thread"}, "'thread' needs a plain `def` handler"),
    ({"handler": "proc.pid", "executor": "fork"}, "executor"),
    ({"handler": "proc.pid", "executor": "process", "instances": 0}, "instances"),
])
async def test_bad_executor_fields_are_refused(pclient, manifest, message):
    resp = await pclient.post("/admin/v1/functions", data=json.dumps({"name": "p-bad", "codePath": ".", **manifest}))
    body = await resp.json()
    assert resp.status == 400 and message in body["message"]
    assert (await pclient.get("/admin/v1/functions/p-bad")).status == 404


# -- streaming ---------------------------------------------------------------------------------
async def test_sse_events_arrive_while_the_worker_runs_real_server(start_server):
    server = start_server("--deploy-dir", str(PROC / "deploy"), "-s", f"runtime.codeRoots=[{PROC}]")
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 20
        while True:  # the worker must be up, or its start-up would count as the first event's delay
            async with session.get(server.url + "/admin/v1/functions/proc-ticker") as r:
                workers = (await r.json())["function"]["status"]["pool"]["workers"]
            if workers and workers[0]["state"] == "idle":
                break
            assert time.monotonic() < deadline, "worker never became ready"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        arrivals, events = [], []
        async with session.post(server.url + "/serverless/v1/functions/proc-ticker/invocations",
                                json={"count": 5, "delay_ms": 200}, headers=SSE) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: "):
                    arrivals.append(time.monotonic() - started)
                    events.append(line[6:].strip().decode())
    assert [json.loads(e)["tick"] for e in events[:5]] == [1, 2, 3, 4, 5]
    assert events[-1] == "[DONE]"
    assert_live(arrivals[:5], 0.8)


async def test_slow_client_blocks_the_worker_and_loses_nothing(make_client, tmp_path):
    client = await make_client(**{"runtime.codeRoots": [str(PROC)], "runtime.deployDir": None,
                                  "frontend.args.streamBufferEvents": 2})
    await deploy(client, "p-big", "big_writer")
    progress = tmp_path / "progress"
    count, size = 300, 200_000  # 60 MB: far more than the socket buffers can hide
    resp = await invoke(client, "p-big", {"count": count, "size": size, "progress": str(progress)}, SSE)
    assert resp.status == 200
    await resp.content.readline()  # the first event has started to arrive; now stop reading

    async def settled():
        before = progress.read_text() if progress.exists() else ""
        await asyncio.sleep(0.3)
        after = progress.read_text() if progress.exists() else ""
        return after if after and after == before else None
    written = int(await wait_until(settled, "the writer to block"))
    assert written < count  # the worker is blocked: backpressure crossed the process boundary
    events = parse_sse("data: " + (await resp.text()))  # now read everything
    assert sum(1 for e in events if len(e) >= size) == count
    assert events[-2] == '"done"' and events[-1] == "[DONE]"


async def test_named_streams_from_workers_sync_and_async(pclient):
    """functions/stream_producer (def, blocking API) and stream_consumer (async API), both in workers."""
    for name, module in (("p-producer", "stream_producer"), ("p-consumer", "stream_consumer")):
        manifest = {"name": name, "handler": f"{module}.handler", "codePath": str(FUNCTIONS),
                    "executor": "process", "instances": 1}
        assert (await pclient.post("/admin/v1/functions", data=json.dumps(manifest))).status == 201
        await wait_ready(pclient, name)
    consumer = asyncio.ensure_future(call_ok(pclient, "p-consumer", {"stream": "proc-s", "timeout_ms": 10000}))

    async def subscribed():
        resp = await pclient.get("/serverless/v1/streams?stream=proc-s")
        return resp.status == 200 and (await resp.json())["streams"][0]["consumers"] == 1
    await wait_until(subscribed, "the worker's subscription")
    sent = await call_ok(pclient, "p-producer", {"stream": "proc-s", "count": 5})
    got = await consumer
    assert sent["sent"] == 5 and got["ended"] == "terminator"
    assert [json.loads(e)["seq"] for e in got["elements"]] == [1, 2, 3, 4, 5]
    for name in ("p-producer", "p-consumer"):  # both really ran in their worker process
        assert (await pool_status(pclient, name))["workers"][0]["invocations"] == 1

    async def released():  # the worker closed its subscription and detached its producer
        resp = await pclient.get("/serverless/v1/streams?stream=proc-s")
        stats = (await resp.json())["streams"][0]
        return stats["consumers"] == 0 and stats["producers"] == 0
    await wait_until(released, "the stream to be released")


# -- hard limits -------------------------------------------------------------------------------
async def test_timeout_kills_and_replaces_the_worker(pclient):
    await deploy(pclient, "p-sleep", "sleeper", timeout=1)
    (old_pid,) = await wait_ready(pclient, "p-sleep")
    resp = await invoke(pclient, "p-sleep", {"seconds": 30})
    body = await resp.json()
    assert resp.status == 504 and body["code"] == 4010 and "timed out" in body["message"]

    async def replaced():  # the replacement's start-up must not count against the next call's 1 s
        workers = (await pool_status(pclient, "p-sleep"))["workers"]
        ready = workers and all(w["state"] == "idle" and w["pid"] != old_pid for w in workers)
        return [w["pid"] for w in workers] if ready else None
    (new_pid,) = await wait_until(replaced, "a replacement worker")
    after = await call_ok(pclient, "p-sleep", {"seconds": 0})
    assert after["pid"] == new_pid != old_pid
    assert (await pool_status(pclient, "p-sleep"))["restarts"] == 1


async def test_client_disconnect_interrupts_the_handler(pclient, tmp_path):
    await deploy(pclient, "p-cancel", "until_cancelled")
    (pid,) = await wait_ready(pclient, "p-cancel")
    marker = tmp_path / "cancelled"
    resp = await invoke(pclient, "p-cancel", {"marker": str(marker)}, SSE)
    assert (await resp.content.readline()).startswith(b"id: 1")
    resp.close()  # the client goes away mid-stream

    async def interrupted():  # written, not just created: write_text opens the file first
        return marker.exists() and marker.read_text() != ""
    await wait_until(interrupted, "the handler to be interrupted")
    assert marker.read_text() == str(pid)  # interrupted in place: its finally block ran
    marker.unlink()
    assert await call_ok(pclient, "p-cancel", {"marker": str(marker), "limit": 3}) == 3
    pool = await pool_status(pclient, "p-cancel")
    assert pool["restarts"] == 0 and pool["workers"][0]["pid"] == pid


async def test_handler_ignoring_cancel_is_killed_after_grace(pclient):
    await deploy(pclient, "p-stubborn", "stubborn", concurrency=1)
    pclient.app[EXECUTOR].runner(kind_named("process")).cancel_grace = 0.3  # (after the deploy: see test_instances)
    await wait_ready(pclient, "p-stubborn")
    resp = await invoke(pclient, "p-stubborn", {}, SSE)
    assert b"started" in await resp.content.readuntil(b"started")
    resp.close()

    async def replaced():
        pool = await pool_status(pclient, "p-stubborn")
        return pool["restarts"] == 1 and pool["workers"] and pool["workers"][0]["state"] == "idle"
    await wait_until(replaced, "the stubborn worker to be killed and replaced")
    # concurrency is 1: the slot of the cancelled invocation was freed once its worker really ended.
    assert await call_ok(pclient, "p-stubborn", {"ok": True}) == "ok"


async def test_memory_limit_fails_clearly_then_a_fresh_worker_runs(pclient):
    await deploy(pclient, "p-hog", "hog", memory=256)
    (old_pid,) = await wait_ready(pclient, "p-hog")
    resp = await invoke(pclient, "p-hog", {"mb": 1024})
    body = await resp.json()
    assert resp.status == 500 and body["code"] == 4001
    assert "exceeded its memory limit of 256 MB" in body["message"]
    assert await call_ok(pclient, "p-hog", {"mb": 1}) == 1024 * 1024
    assert old_pid not in await wait_ready(pclient, "p-hog")


@pytest.mark.parametrize("how, message, same_worker", [
    ("raise", "ValueError: boom from the handler", True),
    ("sys.exit", "the handler called sys.exit(3)", True),
    ("os._exit", "exited with code 7", False),
    ("segfault", "killed by signal SIGSEGV", False),
])
async def test_handler_crash_fails_only_that_invocation(pclient, how, message, same_worker):
    await deploy(pclient, "p-crash", "crash")
    await deploy(pclient, "p-other", "sleeper")
    (old_pid,) = await wait_ready(pclient, "p-crash")
    other = asyncio.ensure_future(call_ok(pclient, "p-other", {"seconds": 0.5}))  # runs meanwhile
    resp = await invoke(pclient, "p-crash", {"how": how})
    body = await resp.json()
    assert resp.status == 500 and body["code"] == 4001 and message in body["message"], body
    assert (await other)["slept"] == 0.5  # other invocations (and the frontend) are untouched
    await deploy(pclient, "p-next", "pid")
    assert (await call_ok(pclient, "p-next", {}))["pid"] != os.getpid()
    pids = await wait_ready(pclient, "p-crash")
    assert (old_pid in pids) == same_worker


async def test_cpu_bound_invocations_run_in_parallel_processes(pclient, tmp_path):
    await deploy(pclient, "p-cpu", "cpu", instances=2, concurrency=2)
    await wait_ready(pclient, "p-cpu")
    event = {"barrier": str(tmp_path), "n": 2, "loops": 200_000}
    a, b = await asyncio.gather(call_ok(pclient, "p-cpu", event), call_ok(pclient, "p-cpu", event))
    assert a["pid"] != b["pid"] and os.getpid() not in (a["pid"], b["pid"])
    assert a["total"] == b["total"] == sum(i * i for i in range(200_000))


# -- lifecycle ---------------------------------------------------------------------------------
async def test_delete_runs_pre_stop_in_the_worker(pclient, tmp_path):
    marker = tmp_path / "stopped"
    await deploy(pclient, "p-stop", "pid", preStop="proc.pre_stop", environment={"marker": str(marker)})
    (pid,) = await wait_ready(pclient, "p-stop")
    assert (await pclient.delete("/admin/v1/functions/p-stop")).status == 200

    async def stopped():
        return marker.exists() and marker.read_text()
    assert await wait_until(stopped, "preStop") == f"preStop {pid}"


async def test_a_hanging_pre_stop_is_given_up_after_the_function_timeout(make_client, tmp_path, caplog):
    """The worker caps preStop at min(timeout, 180 s) itself, well before the pool's stop grace."""
    client = await make_client(**{"runtime.codeRoots": [str(PROC)], "runtime.deployDir": None,
                                  "frontend.args.shutdownGraceSeconds": 60})
    marker = tmp_path / "stopping"
    await deploy(client, "p-hang", "pid", preStop="proc.hanging_pre_stop", timeout=1,
                 environment={"marker": str(marker)})
    (pid,) = await wait_ready(client, "p-hang")
    assert (await client.delete("/admin/v1/functions/p-hang")).status == 200

    await wait_until(process_gone(pid), "the worker to exit without its preStop", limit=20)
    assert marker.read_text() == f"hanging {pid}"                    # it did start
    assert "preStop did not finish within 1 s" in caplog.text        # and the worker said why it went on
    assert f"killing worker {pid}" not in caplog.text                # the worker left; the pool killed nothing


async def test_redeploy_replaces_the_pool_and_stops_the_old_workers(pclient, tmp_path):
    marker = tmp_path / "stopped"
    await deploy(pclient, "p-re", "pid", preStop="proc.pre_stop", environment={"marker": str(marker)})
    (old_pid,) = await wait_ready(pclient, "p-re")
    manifest = {"name": "p-re", "handler": "proc.pid", "codePath": ".", "executor": "process", "instances": 1}
    assert (await pclient.put("/admin/v1/functions/p-re", data=json.dumps(manifest))).status == 200
    assert (await call_ok(pclient, "p-re", {}))["pid"] != old_pid

    async def stopped():
        return marker.exists() and marker.read_text()
    assert await wait_until(stopped, "the old worker's preStop") == f"preStop {old_pid}"


async def test_sigterm_stops_workers_with_pre_stop_and_exits_0(start_server, tmp_path):
    marker = tmp_path / "prestop"
    server = start_server("--deploy-dir", str(PROC / "deploy"), "-s", f"runtime.codeRoots=[{PROC}]",
                          env={"FNSTREAM_TEST_PRESTOP": str(marker)})
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + "/serverless/v1/functions/proc-stop/invocations", json={}) as r:
            pid = (await r.json())["pid"]
    output = server.stop()
    assert server.proc.returncode == 0, output
    assert marker.read_text() == f"preStop {pid}"


# -- deploy: the code is imported in a worker, never in the server ----------------------------
async def test_import_failures_refuse_the_deploy_and_spare_the_server(start_server, tmp_path):
    empty = tmp_path / "deploy"
    empty.mkdir()
    server = start_server("--deploy-dir", str(empty), "-s", f"runtime.codeRoots=[{PROC}]")
    cases = [("exits_at_import", "its worker process exited with code 3 while importing the code"),
             ("fails_at_import", "importing 'fails_at_import' failed: ModuleNotFoundError: "
                                 "No module named 'fnstream_no_such_module'")]
    async with aiohttp.ClientSession() as session:
        for module, message in cases:
            manifest = {"name": "p-import", "handler": f"{module}.handler", "codePath": "import_failures",
                        "executor": "process", "instances": 2}
            async with session.post(server.url + "/admin/v1/functions", data=json.dumps(manifest)) as r:
                body = await r.json()
                assert r.status == 400 and message in body["message"], body
            async with session.get(server.url + "/healthz") as r:
                assert r.status == 200
            async with session.get(server.url + "/admin/v1/functions/p-import") as r:
                assert r.status == 404  # nothing registered
        good = {"name": "p-import", "handler": "proc.pid", "codePath": ".", "executor": "process", "instances": 1}
        async with session.post(server.url + "/admin/v1/functions", data=json.dumps(good)) as r:
            assert r.status == 201, await r.json()
        async with session.post(server.url + "/serverless/v1/functions/p-import/invocations", json={}) as r:
            assert (await r.json())["pid"] != server.pid
    output = server.stop()
    assert server.proc.returncode == 0, output


async def test_process_code_is_not_imported_in_the_server(pclient):
    import sys
    before = set(sys.modules)
    body = await deploy(pclient, "p-where", "gen")
    assert body["status"]["kind"] == "gen"  # reported by the worker that imported it
    assert not [m for m in set(sys.modules) - before if "p_where" in m or m.endswith("proc")]
    assert await call_ok(pclient, "p-where", {"count": 2}) == [{"i": 0}, {"i": 1}]


async def test_a_failed_deploy_of_several_functions_registers_none(pclient):
    manifest = [{"name": "p-ok", "handler": "proc.pid", "codePath": ".", "executor": "process", "instances": 1},
                {"name": "p-bad", "handler": "proc.no_such_handler", "codePath": ".", "executor": "process",
                 "instances": 1}]
    resp = await pclient.post("/admin/v1/functions", data=json.dumps(manifest))
    body = await resp.json()
    assert resp.status == 400 and "has no callable 'no_such_handler'" in body["message"], body
    for name in ("p-ok", "p-bad"):
        assert (await pclient.get(f"/admin/v1/functions/{name}")).status == 404


async def test_a_cancelled_adeploy_stops_the_workers_it_started(tmp_path):
    """A caller cancelled while the first worker imports (a node stopping mid-sync) leaves no worker behind."""
    from runtime.manifest import FunctionSpec
    from runtime.registry import Registry

    (tmp_path / "slow_import.py").write_text(
        "import os, pathlib, time\n"
        "here = pathlib.Path(__file__).parent\n"
        "(here / 'importing').write_text(str(os.getpid()))\n"
        "while not (here / 'release').exists():\n"
        "    time.sleep(0.05)\n"
        "def handler(event, context):\n"
        "    return 1\n")
    registry = Registry([tmp_path])
    spec = FunctionSpec(name="slow-import", handler="slow_import.handler", codePath=tmp_path,
                        executor="process", instances=1)
    task = asyncio.create_task(registry.adeploy([spec]))

    async def importing():
        return (tmp_path / "importing").exists() and (tmp_path / "importing").read_text()
    pid = int(await wait_until(importing, "the worker importing"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (tmp_path / "release").touch()

    await wait_until(process_gone(pid), "the cancelled deploy's worker to exit")
    assert "slow-import" not in registry


async def test_the_manifest_environment_is_the_workers_process_environment(pclient):
    """RunPod worker code reads its settings with os.getenv: in a worker process of its own, the
    function's `environment` is that process's environment."""
    await deploy(pclient, "p-env", "env", environment={"OLLAMA_MODEL_NAME": "tiny", "PYTHONPATH": "/nowhere"})
    resp = await invoke(pclient, "p-env", {"keys": ["OLLAMA_MODEL_NAME", "HOME"]})
    assert await resp.json() == {"OLLAMA_MODEL_NAME": "tiny", "HOME": os.environ.get("HOME")}
