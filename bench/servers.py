"""Starting each benchmark target as its own process, pinned to its own core, and reading its
CPU time and RSS from /proc — the figures must come from separate processes, not one loop."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .client import Target

__all__ = ("ROOT", "BENCH", "ServerProc", "start_target", "free_port", "pin_self", "cpu_plan", "TARGETS",
           "OPTIONAL_TARGETS",
           "make_target")

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
_TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_plan() -> tuple[set[int] | None, set[int] | None]:
    """(server cores, client cores): apart when the machine has two cores or more, else None."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    return {cores[0]}, set(cores[1:2])


def pin_self(cores: set[int] | None) -> None:
    if cores:
        os.sched_setaffinity(0, cores)


class ServerProc:
    """One target server process: its port, its log, its CPU seconds and RSS."""

    def __init__(self, kind: str, cmd: list[str], port: int, log_path: Path, cores: set[int] | None,
                 env: dict | None = None, health: str | None = None, cwd: Path = ROOT,
                 ready_timeout: float = 30) -> None:
        self.kind, self.port, self.log_path = kind, port, log_path
        self._log = open(log_path, "w")  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=self._log,
                                     stderr=subprocess.STDOUT,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
        self._wait_ready(health, ready_timeout)

    def _wait_ready(self, health: str | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited early; see {self.log_path}:\n{self.log_path.read_text()}")
            try:
                if health:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{health}", timeout=1):
                        return
                else:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.kind} did not become ready; see {self.log_path}")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime of every thread

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# kind -> how to start it; each target names its server kind and its paths.
def _command(kind: str, port: int) -> tuple[list[str], dict, str | None]:
    py = sys.executable
    if kind == "aiohttp":  # the ceiling: uvloop, listen backlog 2048
        return [py, "-m", "bench.targets.bare_aiohttp", str(port)], {}, None
    if kind == "aiohttp-asyncio":
        return [py, "-m", "bench.targets.bare_aiohttp", str(port), "asyncio"], {}, None
    if kind == "fastapi":
        return [py, "-m", "bench.targets.fastapi_app", str(port)], {}, None
    if kind in ("fnstream", "fnstream-asyncio"):
        # Access logs off as for the other targets (they log nothing per request either).
        loop = "asyncio" if kind == "fnstream-asyncio" else "auto"
        return ([py, "-m", "frontend.cli", "serve", "--config", str(BENCH / "config.yaml"), "--port", str(port),
                 "-s", f"frontend.loop={loop}"], {"FNSTREAM_LOG": "WARNING"}, "/healthz")
    raise ValueError(kind)


def start_target(kind: str, log_dir: Path, cores: set[int] | None, tree: Path = ROOT,
                 label: str | None = None, wrapper: list[str] | None = None) -> ServerProc:
    """Start a target server; `tree` runs it from another checkout (`python -m` imports from its cwd),
    `wrapper` under a tool (e.g. valgrind: the process keeps the server's pid)."""
    port = free_port()
    cmd, env, health = _command(kind, port)
    if tree != ROOT and kind.startswith("fnstream"):
        cmd += ["-s", "jobs.store=memory"]  # the bench's jobs file belongs to this tree's server
    if wrapper:
        cmd = [*wrapper, *cmd]
    return ServerProc(label or kind, cmd, port, log_dir / f"{label or kind}.log", cores, env, health, cwd=tree,
                      ready_timeout=300 if wrapper else 30)


_FN = "/serverless/v1/functions/{}/invocations"

# name -> (server kind, stream path, echo path)
TARGETS: dict[str, tuple[str, str | None, str | None]] = {
    "aiohttp": ("aiohttp", "/stream", "/echo"),
    "fastapi": ("fastapi", "/stream", "/echo"),
    "fnstream-async": ("fnstream", _FN.format("bench-stream"), _FN.format("bench-echo-async")),
    "fnstream-thread": ("fnstream", _FN.format("bench-stream-thread"), _FN.format("bench-echo")),
    "fnstream-process": ("fnstream", _FN.format("bench-stream-process"), _FN.format("bench-echo-process")),
    # Only when named in --targets: the same servers on asyncio's own loop (the uvloop decision).
    "aiohttp-asyncio": ("aiohttp-asyncio", "/stream", "/echo"),
    "fnstream-async-asyncio": ("fnstream-asyncio", _FN.format("bench-stream"), _FN.format("bench-echo-async")),
    # Only when named: Java functions in worker JVMs (a JDK 17+ and gson), against fnstream-process.
    "fnstream-java": ("fnstream", _FN.format("bench-stream-java"), _FN.format("bench-echo-java")),
}
OPTIONAL_TARGETS = ("aiohttp-asyncio", "fnstream-async-asyncio", "fnstream-java")


def make_target(name: str, server: ServerProc) -> Target:
    _kind, stream_path, echo_path = TARGETS[name]
    return Target(name, "127.0.0.1", server.port, stream_path, echo_path)
