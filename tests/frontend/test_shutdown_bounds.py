"""SIGTERM ends within its bounds whatever is open: `shutdownGraceSeconds` for the invocations and
open responses (then a small margin: aiohttp's own wait is what is left of the grace, not a fixed
10 s), and `preStopGraceSeconds` of its own for the preStop hooks after it. Real servers, real
sockets."""
from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import yaml

from tests.support.servers import FUNCTIONS, HANDLERS, PROCESS_FUNCTIONS, fn
from tests.support.waiting import eventually

INVOKE = "/serverless/v1/functions/{}/invocations"
ROOTS = json.dumps([str(FUNCTIONS), str(HANDLERS), str(PROCESS_FUNCTIONS)])


def _deploy(tmp_path: Path, *functions: dict) -> str:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fns.yaml").write_text(yaml.safe_dump(list(functions)))
    return str(deploy)


def _proc(name: str, handler: str, **fields) -> dict:
    return {"name": name, "handler": handler, "codePath": str(PROCESS_FUNCTIONS), "executor": "process", **fields}


def _never_reading_sse(port: int, name: str, event: dict) -> socket.socket:
    """An SSE invoke whose client takes nothing: the answer blocks on a full socket."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps(event).encode()
    sock.sendall(f"POST {INVOKE.format(name)} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


async def test_sigterm_with_everything_open_ends_soon_after_the_grace(start_server, tmp_path):
    """A response stuck on a client that reads nothing, a running job, a process handler that
    ignores its cancel: all open at SIGTERM with a 1 s grace. aiohttp used to wait a fixed 10 s
    for open responses after the drain (then up to 10 s more for their cancel): the server now
    exits once what is left of the grace and the margin are spent, far inside that 10 s."""
    deploy = _deploy(tmp_path, fn("forever", "testfns.sync_forever", timeout=600),
                     fn("sleeper", "job_fns.sleeper", timeout=600),
                     _proc("stubborn", "proc.stubborn", timeout=600))
    server = start_server("--deploy-dir", deploy, "-s", f"runtime.codeRoots={ROOTS}",
                          "-s", "frontend.args.shutdownGraceSeconds=1")
    stuck = _never_reading_sse(server.port, "forever", {"size": 100_000, "sleep": 0.001})
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/v2/sleeper/run", json={"input": {"seconds": 3600}}) as r:
            assert r.status == 200
        stubborn = await s.post(server.url + INVOKE.format("stubborn"), json={},
                                headers={"Accept": "text/event-stream"})
        assert b"started" in await stubborn.content.readline() + await stubborn.content.readline()

        async def running() -> int:
            async with s.get(f"{server.url}/admin/v1/functions/forever") as r:
                return (await r.json())["function"]["status"]["inflight"]

        await eventually(running, "the stuck stream's invocation running")
        server.proc.terminate()
        # Bound: the 1 s drain and aiohttp's old fixed wait after it (10 s) never fit in it; the
        # exit takes 1 s, 2 s for the stubborn handler's kill (cancel grace), then the exit itself.
        assert await asyncio.to_thread(server.proc.wait, 10) == 0
        stubborn.close()
    stuck.close()
    log = server.stop()
    assert "Traceback" not in log, log


async def test_prestop_hooks_get_their_own_grace_after_the_drain(start_server, tmp_path):
    """A process worker's preStop that needs 2 s finishes although the drain's grace is 0.5 s (it
    used to be killed at the drain's grace); an in-process preStop that would take 60 s (its
    function's timeout) is given up after preStopGraceSeconds, and the server exits 0."""
    marker = tmp_path / "worker-prestop"
    deploy = _deploy(tmp_path, _proc("tidy", "proc.pid", preStop="proc.unhurried_pre_stop", timeout=60,
                                     environment={"marker": str(marker), "preStopSeconds": "2"}),
                     {"name": "slowstop", "handler": "stop_hooks.handler", "preStop": "stop_hooks.slow_pre_stop",
                      "codePath": str(PROCESS_FUNCTIONS), "timeout": 60,
                      "environment": {"marker": str(tmp_path / "thread-prestop")}})
    server = start_server("--deploy-dir", deploy, "-s", f"runtime.codeRoots={ROOTS}",
                          "-s", "frontend.args.shutdownGraceSeconds=0.5", "-s", "frontend.args.preStopGraceSeconds=6")
    async with aiohttp.ClientSession() as s, s.post(server.url + INVOKE.format("tidy"), json={}) as r:
        assert r.status == 200
    server.proc.terminate()
    assert await asyncio.to_thread(server.proc.wait, 30) == 0  # (60 s with the function's timeout alone)
    log = server.stop()
    assert marker.read_text().startswith("finished"), log
    assert "function slowstop: preStop did not finish within 6 s" in log, log
    assert "killing worker" not in log, log
