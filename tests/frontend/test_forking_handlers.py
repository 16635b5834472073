"""Handlers that start processes: a forked child keeps none of the server's listening sockets, job-store
lock or worker channels (runtime/fork_guard.py), and every descendant ends with its server or
worker — a restart never fails because of one. Real servers over real sockets; pids read from /proc."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from pathlib import Path

from tests.support.servers import FUNCTIONS, HANDLERS, fn
from tests.support.waiting import eventually

INVOKE = "/serverless/v1/functions/{}/invocations"


def _invoke(server, name: str, event: dict) -> object:
    req = urllib.request.Request(server.url + INVOKE.format(name), data=json.dumps(event).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _gone(*pids: int) -> None:
    await eventually(lambda: not any(_alive(p) for p in pids), f"processes {pids} to end")


async def _released(pid: int, target: str) -> None:
    """The child lets go of `target` as it starts (its at-fork hook runs before fork() returns there,
    which may be after the parent already answered)."""
    await eventually(lambda: target not in _fd_targets(pid), f"process {pid} to let go of {target}")


def _listening_inode(port: int) -> str:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return fields[9]
    raise AssertionError(f"nothing listens on {port}")


def _fd_targets(pid: int) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    return [os.readlink(fds / n) for n in os.listdir(fds)]


def _serve(start_server, deploy_dir, tmp_path, *manifests):
    deploy = deploy_dir(*manifests)
    return start_server("--deploy-dir", str(deploy), "-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}",
                        "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}")


async def test_a_def_handlers_fork_keeps_nothing_of_the_server_and_ends_with_it(start_server, deploy_dir, tmp_path):
    server = _serve(start_server, deploy_dir, tmp_path, fn("forks", "runaway_fns.forks", timeout=10))
    child = _invoke(server, "forks", {"linger": 60})
    assert isinstance(child, int) and _alive(child)
    await _released(child, f"socket:[{_listening_inode(server.port)}]")  # it would take our connections
    await _released(child, str(tmp_path / "jobs.sqlite3.lock"))           # and keep the store locked
    server.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(server.proc.wait, 20) == 0
    await _gone(child)                                              # it ended with its server
    again = _serve(start_server, deploy_dir, tmp_path, fn("forks", "runaway_fns.forks", timeout=10))
    assert _invoke(again, "forks", {"linger": 0}) != child          # the same store serves again


async def test_a_process_handlers_children_end_with_their_worker(start_server, deploy_dir, tmp_path):
    server = _serve(start_server, deploy_dir, tmp_path,
                    fn("pforks", "runaway_fns.forks", timeout=10, executor="process", instances=1),
                    fn("pspawns", "runaway_fns.spawns", timeout=10, executor="process", instances=1))
    forked = _invoke(server, "pforks", {"linger": 60})
    spawned = _invoke(server, "pspawns", {"linger": 60})
    assert isinstance(forked, int) and isinstance(spawned, dict)
    pids = (forked, spawned["child"], spawned["grandchild"])
    assert all(_alive(p) for p in pids)
    worker = int(Path(f"/proc/{forked}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
    channel_fd = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")[-2].decode()  # worker.py FD
    channel = os.readlink(f"/proc/{worker}/fd/{channel_fd}")
    assert channel.startswith("socket:")
    await _released(forked, channel)  # not the worker's channel
    server.proc.send_signal(signal.SIGTERM)
    # It used to outlive its grace: the worker's channel never closed.
    assert await asyncio.to_thread(server.proc.wait, 30) == 0
    await _gone(*pids)


async def test_a_detached_grandchild_of_a_process_handler_ends_with_the_server(start_server, deploy_dir, tmp_path):
    server = _serve(start_server, deploy_dir, tmp_path,
                    fn("pdetach", "runaway_fns.detaches", timeout=10, executor="process", instances=1))
    daemon = _invoke(server, "pdetach", {"linger": 60})
    assert isinstance(daemon, int) and _alive(daemon)  # in a session of its own: no process group reaches it
    server.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(server.proc.wait, 30) == 0
    await _gone(daemon)  # adopted by its worker (a subreaper), and ended with it
