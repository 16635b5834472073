"""RunPod worker files deploy unchanged: `runpod.serverless.start(...)` at the bottom of the module
records the handler and its options, driven here with the real `runpod` SDK over loopback."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
import runpod

from tests.support.servers import HANDLERS, test_config

ROOT = HANDLERS.parent.parent


@pytest.fixture
async def workers(make_client, deploy_dir):
    deploy = deploy_dir(
        # no `handler`: the module `handler` of codePath, whose start() call names the function
        {"name": "rp-worker", "codePath": str(HANDLERS / "rp_worker")},
        {"name": "rp-sync", "handler": "handler", "codePath": str(HANDLERS / "rp_sync_worker")},
        {"name": "rp-pinned", "handler": "handler.handler", "codePath": str(HANDLERS / "rp_worker"),
         "concurrency": 5},
        {"name": "rp-refresh", "codePath": str(HANDLERS / "rp_refresh_worker")},
        {"name": "rp-keyed", "handler": "keyed", "codePath": str(HANDLERS / "rp_refresh_worker")},
        {"name": "rp-proc", "codePath": str(HANDLERS / "rp_worker"), "executor": "process", "instances": 1},
        {"name": "rp-proc-sync", "codePath": str(HANDLERS / "rp_sync_worker"), "executor": "process",
         "instances": 1},
        {"name": "rp-proc-refresh", "codePath": str(HANDLERS / "rp_refresh_worker"), "executor": "process",
         "instances": 1},
        {"name": "rp-proc-keyed", "handler": "keyed", "codePath": str(HANDLERS / "rp_refresh_worker"),
         "executor": "process", "instances": 1})
    return await make_client(config=test_config(deploy, **{"runtime.codeRoots": [str(HANDLERS)]}))


@pytest.fixture
def sdk(workers):
    runpod.api_key = "unused-without-auth"
    runpod.endpoint_url_base = str(workers.make_url("/v2"))
    return runpod


async def test_async_generator_worker_aggregates_its_stream(sdk):
    endpoint = sdk.Endpoint("rp-worker")
    out = await asyncio.to_thread(endpoint.run_sync, {"input": {"prompt": "hi", "n": 3}}, 30)
    assert out == [{"token": "hi-0"}, {"token": "hi-1"}, {"token": "hi-2"}]
    job = await asyncio.to_thread(endpoint.run, {"prompt": "s", "n": 2})
    assert [i async for i in _aiter(job.stream)] == [{"token": "s-0"}, {"token": "s-1"}]


async def _aiter(stream):
    for item in await asyncio.to_thread(lambda: list(stream())):
        yield item


async def test_without_return_aggregate_stream_the_output_holds_no_items(sdk, workers):
    endpoint = sdk.Endpoint("rp-sync")
    assert await asyncio.to_thread(endpoint.run_sync, {"input": {"n": 2}}, 30) == []
    job = await asyncio.to_thread(endpoint.run, {"n": 3})
    assert [i async for i in _aiter(job.stream)] == ["item-0", "item-1", "item-2"]


async def test_concurrency_modifier_sets_the_jobs_one_instance_takes(workers, tmp_path):
    health = await (await workers.get("/v2/rp-worker/health")).json()
    assert health["workers"] == {"idle": 2, "running": 0}
    # the manifest's own `concurrency` wins over the code's
    assert (await (await workers.get("/v2/rp-pinned/health")).json())["workers"]["idle"] == 5
    gate = tmp_path / "go"
    ids = []
    for _ in range(3):
        resp = await workers.post("/v2/rp-worker/run", json={"input": {"hold": str(gate), "n": 1}})
        ids.append((await resp.json())["id"])
    statuses = await _statuses(workers, ids, until=lambda s: s.count("IN_PROGRESS") == 2)
    assert sorted(statuses) == ["IN_PROGRESS", "IN_PROGRESS", "IN_QUEUE"]
    for _ in range(5):  # the third stays queued while both slots are held
        await asyncio.sleep(0.05)
        assert sorted(await _statuses(workers, ids)) == ["IN_PROGRESS", "IN_PROGRESS", "IN_QUEUE"]
    gate.touch()
    assert await _statuses(workers, ids, until=lambda s: s == ["COMPLETED"] * 3) == ["COMPLETED"] * 3


async def _statuses(client, ids, until=None):
    while True:
        statuses = [(await (await client.get(f"/v2/rp-worker/status/{i}")).json())["status"] for i in ids]
        if until is None or until(statuses):
            return statuses
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("name", ["rp-worker", "rp-proc"])
async def test_progress_update_shows_in_status_while_the_job_runs(sdk, workers, tmp_path, name):
    """In-process, and from a worker process (a `progress` frame)."""
    gate = tmp_path / "go"
    job = await asyncio.to_thread(sdk.Endpoint(name).run,
                                  {"progress": {"step": 1, "of": 2}, "hold": str(gate), "n": 1})
    while True:
        body = await (await workers.get(f"/v2/{name}/status/{job.job_id}")).json()
        if "output" in body:
            break
        await asyncio.sleep(0.02)
    assert body["status"] == "IN_PROGRESS" and body["output"] == {"step": 1, "of": 2}
    gate.touch()
    assert await asyncio.to_thread(job.output, 20) == [{"token": "t-0"}]


@pytest.mark.parametrize("prefix", ["rp-", "rp-proc-"])
async def test_refresh_worker_recycles_the_instance_after_each_job(sdk, prefix):
    """In-process, and with executor: process (the worker that ran the job retires; a fresh one)."""
    refreshed, keyed = sdk.Endpoint(f"{prefix}refresh"), sdk.Endpoint(f"{prefix}keyed")
    for _ in range(2):  # a fresh module each time
        assert await asyncio.to_thread(refreshed.run_sync, {"input": {}}, 30) == {"jobs_seen_by_this_instance": 1}
    # without the option the instance lives on, until an output carries `refresh_worker` (not shown)
    seen = [await asyncio.to_thread(keyed.run_sync, {"input": {"refresh": r}}, 30) for r in (False, True, False)]
    assert seen == [{"jobs_seen_by_this_instance": n} for n in (1, 2, 1)]


@pytest.mark.parametrize("prefix", ["rp-", "rp-proc-"])
async def test_a_plain_invoke_does_not_refresh_the_worker(sdk, workers, prefix):
    """runpod-python applies refresh_worker to jobs of its serverless worker loop (rp_scale
    JobScaler.handle_job, rp_job.run_job), never to a request that is not a job: a plain invoke
    keeps the instance (and its worker process), then a job still retires it."""
    async def invoke(name, event):
        resp = await workers.post(f"/serverless/v1/functions/{name}/invocations", json=event)
        assert resp.status == 200, await resp.text()
        return await resp.json()
    seen = [await invoke(f"{prefix}refresh", {"input": {}}) for _ in range(3)]
    assert seen == [{"jobs_seen_by_this_instance": n} for n in (1, 2, 3)]
    # a returned `refresh_worker` key on a plain invoke is the handler's output, and refreshes nothing
    assert await invoke(f"{prefix}keyed", {"input": {"refresh": True}}) == {
        "jobs_seen_by_this_instance": 1, "refresh_worker": True}
    assert await invoke(f"{prefix}keyed", {"input": {}}) == {"jobs_seen_by_this_instance": 2}
    # a job is a job: it runs on the same instance, which is recycled after it
    endpoint = sdk.Endpoint(f"{prefix}refresh")
    assert await asyncio.to_thread(endpoint.run_sync, {"input": {}}, 30) == {"jobs_seen_by_this_instance": 4}
    assert await invoke(f"{prefix}refresh", {"input": {}}) == {"jobs_seen_by_this_instance": 1}


async def test_process_workers_take_the_start_options(sdk, workers):
    """In worker processes: concurrency_modifier is each worker's instanceConcurrency, and
    return_aggregate_stream decides the output as in-process."""
    pool = (await (await workers.get("/admin/v1/functions/rp-proc")).json())["function"]["status"]["pool"]
    assert pool["instanceConcurrency"] == 2 and pool["workers"][0]["slots"] == 2
    assert await asyncio.to_thread(sdk.Endpoint("rp-proc-sync").run_sync, {"input": {"n": 2}}, 30) == []
    out = await asyncio.to_thread(sdk.Endpoint("rp-proc").run_sync, {"input": {"prompt": "p", "n": 2}}, 30)
    assert len(out) == 2  # the items (a worker process sends them as text)


def test_worker_file_imports_without_the_runpod_package(tmp_path):
    """With no `runpod` installed, fnstream's stand-in makes the same file load (a fresh interpreter
    in which `import runpod` of the real package fails)."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.modules["runpod"] = None  # as if not installed: `import runpod` fails, find_spec finds nothing
        from pathlib import Path
        from runtime.loader import load_code
        from runtime.manifest import FunctionSpec
        import runpod
        assert not hasattr(runpod, "__file__"), "the stand-in, not the real package"
        spec = FunctionSpec(name="w", codePath=Path({str(HANDLERS / "rp_worker")!r}))
        code = load_code(spec, [])
        assert code.runpod.concurrency == 2 and code.runpod.aggregate_stream
        async def run():
            return [i async for i in code.handler({{"id": "j", "input": {{"prompt": "x", "n": 2}}}}, None)]
        print(asyncio.run(run()))
        try:
            runpod.serverless.start({{"handler": print}})
        except RuntimeError as exc:
            print("outside:", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[{'token': 'x-0'}, {'token': 'x-1'}]"
    assert lines[1].startswith("outside: runpod.serverless.start(): this `runpod` is fnstream's stand-in")
