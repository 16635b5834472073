"""Fixtures for cluster tests: a private redis-server on a free port, and `fnstream worker` processes."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from conftest import FUNCTIONS, FnstreamProcess, free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
CLUSTER_FUNCTIONS = Path(__file__).resolve().parent / "cluster_functions"
# Short timings so liveness, reclaim and sync happen within a test's patience.
FAST = ["-s", "cluster.workerHeartbeatSeconds=0.2", "-s", "cluster.claimIdleSeconds=1",
        "-s", "cluster.registrySyncSeconds=0.5",
        "-s", f"runtime.codeRoots=[{FUNCTIONS},{CLUSTER_FUNCTIONS}]"]


class RedisServer:
    """A throw-away redis-server (no persistence) that tests can kill and restart on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class WorkerProcess(FnstreamProcess):
    """A real `fnstream worker --cluster URL` subprocess."""

    def __init__(self, url: str, *args: str) -> None:
        super().__init__("worker", "--cluster", url, *FAST, *args, env={"FNSTREAM_LOG": "WARNING"})


@pytest.fixture
def redis_server():
    server = RedisServer()
    yield server
    server.kill()


@pytest.fixture
def start_worker():
    workers: list[WorkerProcess] = []

    def factory(url: str, *args: str) -> WorkerProcess:
        w = WorkerProcess(url, *args)
        workers.append(w)
        return w

    yield factory
    for w in workers:
        w.stop()
