"""Handlers that start processes: a forked child keeps none of the server's listening sockets, job-store
lock or worker channels (runtime/fork_guard.py), and every descendant ends with its server or
worker — a restart never fails because of one. Real servers over real sockets; pids read from /proc."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
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
    targets = []
    for name in os.listdir(fds):
        try:
            targets.append(os.readlink(fds / name))
        except FileNotFoundError:  # closed between the listing and the read
            pass
    return targets


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



def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found + [d for c in found for d in _descendants(c)]


def _with_workers(start_server, deploy_dir, tmp_path, forker: str):
    """A server with two process functions, their workers up, and a def function `forks` whose
    handler forks a child that lingers: (server, its workers' pids)."""
    server = _serve(start_server, deploy_dir, tmp_path, fn("forks", forker, timeout=10),
                    fn("pa", "testfns.echo_sync", executor="process", instances=2),
                    fn("pb", "testfns.echo_sync", executor="process", instances=1))
    assert _invoke(server, "pa", {"x": 1}) == _invoke(server, "pb", {"x": 1}) == {"x": 1}
    workers = _descendants(server.proc.pid)
    assert len(workers) >= 2 and all(_alive(w) for w in workers)
    return server, workers


def _keep_alive(server) -> socket.socket:
    """A client connection the server accepted and keeps open (HTTP/1.1 keep-alive, one request done)."""
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert conn.recv(65536).startswith(b"HTTP/1.1 200")
    conn.setblocking(False)
    return conn


def _closed(conn: socket.socket) -> bool:
    try:
        return conn.recv(65536) == b""
    except BlockingIOError:
        return False  # open, nothing to read
    except ConnectionResetError:
        return True


async def test_a_def_handlers_fork_ends_with_its_server_killed_and_so_do_the_workers(start_server, deploy_dir,
                                                                                   tmp_path):
    server, workers = _with_workers(start_server, deploy_dir, tmp_path, "runaway_fns.forks")
    child = _invoke(server, "forks", {"linger": 60})
    assert isinstance(child, int) and _alive(child) and child not in workers
    server.proc.kill()  # no code of the server's runs at its end: what ends, ends by itself
    await _gone(child)  # it died with its server (it used to linger, adopted by init)
    await _gone(*workers)


async def test_a_fork_that_outlives_a_killed_server_keeps_none_of_its_channels_connections_or_store(
        start_server, deploy_dir, tmp_path):
    # Forked from a thread of the handler's own, which has ended: nothing ties the child's life to
    # the server's, so it outlives the kill -9, holding nothing that keeps another process waiting.
    server, workers = _with_workers(start_server, deploy_dir, tmp_path, "runaway_fns.forks_in_a_thread")
    client = _keep_alive(server)
    child = _invoke(server, "forks", {"linger": 60})
    assert isinstance(child, int) and _alive(child) and child not in workers
    try:
        store = str(tmp_path / "jobs.sqlite3")  # the database, its WAL, its lock, its journal of ends
        await eventually(lambda: [t for t in _fd_targets(child) if t.startswith(store)] == [],
                         "the fork child to let go of the job store's files")
        server.proc.kill()
        await _gone(*workers)  # they saw their channel close: the child held none of the server's ends
        await eventually(lambda: _closed(client), "the client to see its connection closed")
        assert _alive(child)
    finally:
        client.close()
        os.kill(child, signal.SIGKILL)
