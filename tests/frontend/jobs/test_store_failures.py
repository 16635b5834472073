"""A job store that refuses writes (a full 1 MB tmpfs under a real `fnstream serve`, or an injected
sqlite3.OperationalError): a submit is answered 507 and its handler never starts; a refused output
write is retried, then fails the job loudly (status, metric, one log line); after a restart nothing
reported COMPLETED reverted and nothing ran twice. A corrupt store stops start-up with one line."""
from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from frontend.jobs import JOB_STORE
from tests.support.servers import FUNCTIONS, HANDLERS, FnstreamProcess, fn, free_port
from tests.support.waiting import eventually

ASYNC = {"X-Invoke-Type": "async"}


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MB tmpfs (as root); skipped where mounting is not permitted."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the file system of `directory` up to `leave` free bytes with one file."""
    filler = directory / "filler"
    st = os.statvfs(directory)
    want = max(0, st.f_bavail * st.f_frsize - leave)
    with open(filler, "wb") as f:
        try:
            while want > 0:
                f.write(b"\0" * min(want, 65536))
                f.flush()
                want -= 65536
        except OSError:
            pass  # full already
    return filler


def serve_args(tmp_path: Path, store: Path) -> tuple[str, ...]:
    deploy = tmp_path / "deploy"
    deploy.mkdir(exist_ok=True)
    (deploy / "fns.yaml").write_text(yaml.safe_dump([fn("marked", "job_fns.marked", concurrency=1),
                                                     fn("echo-job", "job_fns.echo")]))
    return ("--deploy-dir", str(deploy), "-s", f"jobs.path={store}",
            "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}")


async def wait_status(s, url, name, job_id, want, timeout=30.0) -> dict:
    for _ in range(int(timeout / 0.05)):
        async with s.get(f"{url}/v2/{name}/status/{job_id}") as r:
            body = await r.json()
        if body["status"] in want:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {want}: {body}")


async def metric(s, url, name) -> float:
    async with s.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)


async def test_submits_to_a_full_store_are_507_and_never_run(start_server, tmp_path, tmpfs):
    marks = tmp_path / "marks"
    server = start_server(*serve_args(tmp_path, tmpfs / "jobs.sqlite3"))
    filler = fill(tmpfs)
    inp = {"input": {"mark": str(marks)}}
    async with aiohttp.ClientSession() as s:
        async def post(path, **kw):
            async with s.post(f"{server.url}{path}", **kw) as r:
                return r.status, await r.json()

        answers = await asyncio.gather(*(post("/v2/marked/run", json=inp) for _ in range(20)))
        for status, body in answers:  # RunPod's shape
            assert status == 507 and "job store" in body["error"] and "full" in body["error"], body
        status, body = await post("/v2/marked/runsync", json=inp)
        assert status == 507 and "job store" in body["error"], body
        status, body = await post("/serverless/v1/functions/marked/invocations", json=inp, headers=ASYNC)
        assert status == 507 and body["code"] == 200507 and "job store" in body["message"], body
        assert await metric(s, server.url, "fnstream_job_store_refused_writes_total") >= 22

        filler.unlink()  # room again: a job behind them (concurrency 1, FIFO) runs, and only it
        status, body = await post("/v2/marked/run", json=inp)
        assert status == 200, body
        done = await wait_status(s, server.url, "marked", body["id"], {"COMPLETED", "FAILED"})
        assert done["status"] == "COMPLETED", done
        assert marks.read_text().split() == [body["id"]]  # none of the refused ones ever started
        async with s.get(f"{server.url}/serverless/v1/jobs") as r:
            assert [j["id"] for j in (await r.json())["jobs"]] == [body["id"]]
    log = server.stop()
    assert "Future exception was never retrieved" not in log and "Traceback" not in log, log


async def test_refused_output_writes_fail_the_job_loudly_and_nothing_reverts(start_server, tmp_path, tmpfs):
    marks = tmp_path / "marks"
    args = serve_args(tmp_path, tmpfs / "jobs.sqlite3")
    server = start_server(*args)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/v2/echo-job/runsync", json={"input": {"before": "full"}}) as r:
            before = await r.json()
        assert before["status"] == "COMPLETED", before
        filler = fill(tmpfs, leave=256 * 1024)
        # 800 kB of output into 256 kB of room: an output write is refused, retried, refused again
        async with s.post(f"{server.url}/v2/marked/run",
                          json={"input": {"mark": str(marks), "n": 40, "size": 20_000}}) as r:
            assert r.status == 200, await r.text()
            job_id = (await r.json())["id"]
        failed = await wait_status(s, server.url, "marked", job_id, {"COMPLETED", "FAILED"})
        assert failed["status"] == "FAILED" and "could not be stored" in failed["error"], failed
        assert "database or disk is full" in failed["error"]
        async with s.get(f"{server.url}/serverless/v1/jobs/{job_id}") as r:
            shown = await r.json()
        assert 0 <= shown["outputCount"] < 40 and shown["statusCode"] == 507
        assert await metric(s, server.url, "fnstream_job_store_failures_total") == 1
        assert await metric(s, server.url, "fnstream_job_store_refused_writes_total") >= 4  # 1 + 3 retries
        lines = [ln for ln in server.output().splitlines() if job_id in ln and "refused its write" in ln]
        assert len(lines) == 1, server.output()

        filler.unlink()  # room again: a FAILED end the store refused too is stored by the next flush
        if f"the end of job {job_id} is not stored yet" in server.output():
            await eventually(lambda: f"the final state of job {job_id} is stored now" in server.output(),
                             "the refused end stored by a flush")
        server.kill()  # kill -9: what a restart finds is what was stored

        server = start_server(*args)
        after = await wait_status(s, server.url, "marked", job_id, {"COMPLETED", "FAILED"})
        assert after["status"] == "FAILED" and after["error"] == failed["error"], after
        async with s.get(f"{server.url}/serverless/v1/jobs/{job_id}") as r:
            again = await r.json()
        assert again["outputCount"] == shown["outputCount"]
        async with s.get(f"{server.url}/v2/echo-job/status/{before['id']}") as r:
            assert await r.json() == {**before, "delayTime": before["delayTime"]}  # COMPLETED, as reported
        async with s.post(f"{server.url}/v2/echo-job/runsync", json={"input": {}}) as r:
            assert (await r.json())["status"] == "COMPLETED"  # the restarted server has run its queue
    assert marks.read_text().split() == [job_id]  # it ran once
    log = server.stop()
    assert "Future exception was never retrieved" not in log, log


def _fail_writes(store, fails: dict[str, int]) -> None:
    """Make the store's thread raise sqlite3.OperationalError inside the next fails[kind] writes of a kind
    ("outputs": add_outputs, "row": save): the error SQLite gives on a full disk."""
    original = store._write

    def write(fn):
        kind = "outputs" if fn.__name__ == "append" else "row"

        def failing(db):
            if fails.get(kind, 0) > 0:
                fails[kind] -= 1
                raise sqlite3.OperationalError("database or disk is full")
            return fn(db)

        return original(failing)

    store._write = write


async def test_a_refused_output_write_is_retried(make_client, job_config):
    client = await make_client(config=job_config())
    fails = {"outputs": 2}
    _fail_writes(client.server.app[JOB_STORE], fails)
    resp = await client.post("/v2/count/runsync", json={"input": {"n": 3}})
    body = await resp.json()
    assert body["status"] == "COMPLETED" and len(body["output"]) == 3, body
    assert fails["outputs"] == 0  # both refusals happened, and the retries got the items stored
    metrics = await (await client.get("/metrics")).text()
    assert "fnstream_job_store_failures_total 0.0" in metrics
    assert "fnstream_job_store_refused_writes_total 2.0" in metrics


async def test_a_completed_job_is_stored_before_it_is_shown(make_client, job_config):
    """A final write refused every time: never COMPLETED, even for a moment; FAILED 507 instead."""
    client = await make_client(config=job_config())
    store = client.server.app[JOB_STORE]
    resp = await client.post("/v2/echo-job/run", json={"input": {}})
    job_id = (await resp.json())["id"]
    manager_job = None
    fails = {"row": 1000}
    _fail_writes(store, fails)
    seen = set()
    for _ in range(400):
        body = await (await client.get(f"/serverless/v1/jobs/{job_id}")).json()
        seen.add(body["status"])
        if body["status"] in ("COMPLETED", "FAILED"):
            manager_job = body
            break
        await asyncio.sleep(0.02)
    assert manager_job is not None and "COMPLETED" not in seen, seen
    assert manager_job["statusCode"] == 507, manager_job


async def test_a_corrupt_store_stops_start_up_with_one_line(tmp_path):
    store = tmp_path / "jobs.sqlite3"
    store.write_bytes(b"this is not a database, " * 200)
    await _refused_at_start(store)


async def _refused_at_start(store: Path) -> None:
    """`fnstream serve` on `store` exits 2 with one line naming it, no traceback."""
    proc = FnstreamProcess("serve", "--port", str(free_port()), "-s", f"jobs.path={store}")
    assert await asyncio.to_thread(proc.proc.wait, 30) == 2
    out = proc.stop()
    assert "Traceback" not in out, out
    errors = [ln for ln in out.splitlines() if ln.startswith("fnstream:")]
    assert len(errors) == 1 and str(store) in errors[0], out


async def test_a_read_only_store_stops_start_up_with_one_line(start_server, tmp_path, tmpfs):
    store = tmpfs / "jobs.sqlite3"
    start_server("-s", f"jobs.path={store}").stop()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    await _refused_at_start(store)


async def test_an_end_the_full_store_refused_survives_kill_9_and_the_job_never_runs_again(start_server, tmp_path,
                                                                                          tmpfs):
    # Its end is refused, it is answered FAILED, the server dies before a flush: the journal of
    # unstored ends (allocated at start, while there was room) still knows it is over.
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    args = serve_args(tmp_path, tmpfs / "jobs.sqlite3")
    server = start_server(*args)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/v2/marked/run",
                          json={"input": {"mark": str(marks), "gate": str(gate), "n": 1, "size": 50_000}}) as r:
            assert r.status == 200, await r.text()
            job_id = (await r.json())["id"]
        await wait_status(s, server.url, "marked", job_id, {"IN_PROGRESS"})  # stored running
        await eventually(lambda: marks.exists() and marks.read_text().split() == [job_id], "the handler started")
        fill(tmpfs)
        gate.write_text("go")  # its output and then its end are refused
        failed = await wait_status(s, server.url, "marked", job_id, {"COMPLETED", "FAILED"})
        assert failed["status"] == "FAILED" and "could not be stored" in failed["error"], failed
        await eventually(lambda: f"the end of job {job_id} is not stored yet" in server.output(), "the refused end")
        server.kill()  # before any flush could store it

        server = start_server(*args)  # the disk still full: the end is applied, and kept for later
        after = await wait_status(s, server.url, "marked", job_id, {"COMPLETED", "FAILED", "IN_QUEUE", "IN_PROGRESS"})
        assert after["status"] == "FAILED", after  # over, as its clients were told
        server.kill()
        (tmpfs / "filler").unlink()

        server = start_server(*args)  # room again: still over, and never run again
        after = await wait_status(s, server.url, "marked", job_id, {"COMPLETED", "FAILED", "IN_QUEUE", "IN_PROGRESS"})
        assert after["status"] == "FAILED", after
        async with s.post(f"{server.url}/v2/echo-job/runsync", json={"input": {}}) as r:
            assert (await r.json())["status"] == "COMPLETED"  # the restarted server has run its queue
    assert marks.read_text().split() == [job_id]  # it ran once
