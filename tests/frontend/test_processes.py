"""`fnstream serve --processes N`: cluster-mode frontends sharing one port (SO_REUSEPORT), supervised.

Which process accepted a connection is read from /proc (the socket inodes each child holds), so the
test sees both frontends serve without the server exposing anything for it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cluster import FAST
from tests.support.servers import ROOT, FnstreamProcess, free_port

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; SO_REUSEPORT balancing is Linux's")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _established_on(port: int) -> set[int]:
    """Inodes of established TCP sockets whose local port is `port`."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _healthz(sock: socket.socket) -> int:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    return int(sock.recv(65536).split()[1])


def _wait_serving(port: int, pid: int, count: int, timeout: float = 30, without: int | None = None) -> list[int]:
    """Wait until `pid` has `count` children (none of them `without`, a child just killed: the
    kill lands asynchronously, so right after it the old child may still be listed and listening)
    and the port answers; the children's pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = _children(pid)
        if len(kids) == count and without not in kids and all(_listening(k, port) for k in kids):
            return kids
        time.sleep(0.1)
    raise AssertionError(f"{count} frontends did not come up; children {_children(pid)}")


def _listening(pid: int, port: int) -> bool:
    listening = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
            listening.add(int(fields[9]))
    try:
        return bool(listening & _socket_inodes(pid))
    except FileNotFoundError:
        return False


def test_processes_refused_in_embedded_mode():
    out = subprocess.run([sys.executable, "-m", "frontend.cli", "serve", "--processes", "2", "--port",
                          str(free_port())], check=False, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "--processes 2 needs cluster mode" in out.stderr


def test_two_frontends_share_the_port_and_a_killed_one_is_restarted(redis_server):
    port = free_port()
    group = FnstreamProcess("serve", "--processes", "2", "--cluster", redis_server.url, "--port", str(port), *FAST)
    try:
        kids = _wait_serving(port, group.pid, 2)
        conns: list[socket.socket] = []
        try:
            # The kernel picks a frontend per connection by a hash of its addresses and ports, so
            # any fixed number can all land on one: open (and keep) connections until both have
            # accepted one; 2 ** -99 is the chance that 100 fair picks miss one of them.
            served = dict.fromkeys(kids, 0)
            while len(conns) < 100 and not all(served.values()):
                conns.append(socket.create_connection(("127.0.0.1", port), timeout=10))
                assert _healthz(conns[-1]) == 200
                established = _established_on(port)
                served = {kid: len(_socket_inodes(kid) & established) for kid in kids}
            assert all(n > 0 for n in served.values()), (served, _children(group.pid))  # both frontends served
        finally:
            for c in conns:
                c.close()

        os.kill(kids[0], signal.SIGKILL)
        restarted = _wait_serving(port, group.pid, 2, without=kids[0])
        assert kids[1] in restarted
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                assert _healthz(c) == 200

        group.proc.send_signal(signal.SIGTERM)  # forwarded: every frontend stops, one exit code
        assert group.proc.wait(30) == 0
        assert "restarting" in group.output()
        for kid in restarted:
            assert not Path(f"/proc/{kid}").exists() or "zombie" in Path(f"/proc/{kid}/status").read_text()
    finally:
        group.stop()


def test_reuse_port_is_refused_in_embedded_mode():
    out = subprocess.run([sys.executable, "-m", "frontend.cli", "serve", "--port", str(free_port()),
                          "-s", "frontend.reusePort=true"], check=False, cwd=ROOT, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "frontend.reusePort needs cluster mode" in out.stderr


def test_a_frontend_failing_with_a_bad_deploy_dir_stops_the_group_with_2(redis_server, tmp_path):
    port = free_port()
    group = FnstreamProcess("serve", "--processes", "2", "--cluster", redis_server.url, "--port", str(port),
                            "--deploy-dir", str(tmp_path / "missing"), *FAST)
    try:
        assert group.proc.wait(30) == 2  # no restart loop: every restart would fail alike
        assert "bad config or deploy directory" in group.output()
    finally:
        group.stop()


@pytest.mark.parametrize("cluster", [False, True], ids=["embedded", "cluster"])
def test_a_port_in_use_ends_serve_with_2_and_says_so(redis_server, cluster):
    """The listener is started after the app (and a cluster node's tasks): a port that cannot be had
    used to leave a cluster-mode server running with nothing listening, and no message."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--cluster", redis_server.url, *FAST] if cluster else []
        out = subprocess.run([sys.executable, "-m", "frontend.cli", "serve", "--port", str(port), *args],
                             check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr and "Task was destroyed" not in out.stderr


def test_a_backlog_listen_cannot_take_is_a_config_error():
    out = subprocess.run([sys.executable, "-m", "frontend.cli", "serve", "--port", str(free_port()),
                          "-s", "frontend.backlog=2147483648"], check=False, cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and "frontend.backlog" in out.stderr


def test_a_stop_while_the_frontends_still_start_exits_0(redis_server):
    """SIGTERM forwarded to children that have not installed their handlers yet ends them by the
    signal itself (-15): that is the stop asked for, not a failure (the group used to exit 143)."""
    port = free_port()
    group = FnstreamProcess("serve", "--processes", "2", "--cluster", redis_server.url, "--port", str(port), *FAST)
    try:
        deadline = time.monotonic() + 30
        while len(_children(group.proc.pid)) < 2:  # both started, and still importing (a second or more)
            assert time.monotonic() < deadline, group.output()
            time.sleep(0.01)
        group.proc.send_signal(signal.SIGTERM)
        assert group.proc.wait(30) == 0, group.output()
    finally:
        group.stop()
