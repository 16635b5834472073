"""`fnstream worker` shuts down as `fnstream serve` does (runtime/lifecycle.py): on SIGTERM it takes
no more work, lets the invocation it runs finish within the grace, runs preStop and exits 0."""
from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
from test_cluster import deploy, frontend_args, status, wait_until, workers_serving

from tests.support.cluster import CLUSTER_FUNCTIONS
from tests.support.servers import FUNCTIONS, PROCESS_FUNCTIONS

ROOTS = f"runtime.codeRoots=[{FUNCTIONS},{CLUSTER_FUNCTIONS},{PROCESS_FUNCTIONS}]"


def _manifest(marker: Path) -> dict:
    return {"name": "stopper", "handler": "stop_hooks.handler", "preStop": "stop_hooks.pre_stop",
            "codePath": str(PROCESS_FUNCTIONS), "timeout": 30,
            "environment": {"marker": str(marker), "tag": "v1"}}


async def test_sigterm_on_a_worker_finishes_the_running_invocation_then_runs_pre_stop(
        redis_server, start_server, start_worker, tmp_path):
    marker, release = tmp_path / "marker", tmp_path / "release"
    front = start_server(*frontend_args(redis_server.url), "-s", ROOTS, env={"FNSTREAM_LOG": "WARNING"})
    worker = start_worker(redis_server.url, "-s", ROOTS, "-s", "frontend.args.shutdownGraceSeconds=20")
    async with aiohttp.ClientSession() as session:
        await deploy(session, front.url, _manifest(marker))
        await workers_serving(session, front.url, "stopper")
        url = f"{front.url}/serverless/v1/functions/stopper/invocations"

        async def invoke() -> tuple[int, dict]:
            async with session.post(url, json={"until": str(release)}) as r:
                return r.status, await r.json()

        call = asyncio.ensure_future(invoke())

        async def running():
            st = await status(session, front.url)
            return any(w["running"] for w in st["workers"])
        await wait_until(running, "the worker to run the invocation")
        assert "invocation-end" not in (marker.read_text() if marker.exists() else "")  # ends on `release`
        worker.proc.send_signal(signal.SIGTERM)

        async def draining():  # alive (relaying what it runs) but serving nothing new, or gone
            st = await status(session, front.url)
            return not any(w["functions"] for w in st["workers"])
        await wait_until(draining, "the worker to stop taking work")
        async with session.post(url, json={}) as r:  # nothing takes new work: a clear 503, not a hang
            refused = await r.json()
            assert r.status == 503 and "no live worker serves function 'stopper'" in refused["message"], refused
        assert not call.done()  # the draining worker still runs it
        release.touch()

        code, body = await call
        assert code == 200, body
        assert body == {"tag": "v1"}
    rc = await asyncio.to_thread(worker.proc.wait, 30)
    output = worker.stop()
    assert rc == 0, output
    # The invocation ended before the hook ran: in the marker file, not by the clock. (A deployment
    # the worker replaced while it synced the registry may have run its own preStop earlier.)
    lines = marker.read_text().splitlines()
    assert lines.count("invocation-end v1") == 1 and lines[-1] == "preStop v1", (lines, output)
    assert lines.index("invocation-end v1") < len(lines) - 1, (lines, output)
