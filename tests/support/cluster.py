"""Helpers for cluster tests: a private redis-server (or a 3-master Redis Cluster) on free ports,
and `fnstream worker` processes."""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import redis

from frontend.client import iter_sse
from tests.support.servers import FUNCTIONS, TESTS, FnstreamProcess, free_port
from tests.support.waiting import eventually

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
# The reason every Redis-backed test skips with when redis-server is absent; `pytest --require-redis`
# (as .ci/run runs) turns any such skip into a failed run.
NO_REDIS = "needs redis-server on PATH (apt-get install redis-server)"


def require_redis_server() -> None:
    """Skip the calling test, with NO_REDIS as the reason, when redis-server is not installed."""
    if shutil.which("redis-server") is None:
        pytest.skip(NO_REDIS)
CLUSTER_FUNCTIONS = TESTS / "cluster_functions"
# Short timings so liveness, reclaim and sync happen within a test's patience.
FAST = ["-s", "cluster.workerHeartbeatSeconds=0.2", "-s", "cluster.claimIdleSeconds=1",
        "-s", "cluster.registrySyncSeconds=0.5",
        "-s", f"runtime.codeRoots=[{FUNCTIONS},{CLUSTER_FUNCTIONS}]"]


def wait_for_redis(client: redis.Redis) -> None:
    """Return once a just-started redis-server answers PING (4 s at most)."""
    for _ in range(200):
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.02)
    raise RuntimeError("redis-server did not start")


class RedisServer:
    """A throw-away redis-server that tests can kill and restart on the same port: no persistence,
    or with `aof` (a directory) an append-only file fsynced on every write (`appendfsync always`),
    so a restart on the same directory keeps every acknowledged write."""

    def __init__(self, aof: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.aof = aof
        self.proc: subprocess.Popen | None = None
        self._client: redis.Redis | None = None
        self.start()

    def start(self) -> None:
        persistence = ["--appendonly", "no"] if self.aof is None else [
            "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.aof)]
        self.proc = subprocess.Popen([REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      *persistence], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_redis(self.client())

    def client(self) -> redis.Redis:
        """One client for the tests of this server, closed with it (an unclosed one's sockets are
        ResourceWarnings whenever the garbage collector meets them, in whichever test runs then)."""
        if self._client is None:
            self._client = redis.Redis(port=self.port, decode_responses=True)
        return self._client

    def kill(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisClusterServers:
    """Three redis-server masters (no replicas, no persistence) joined into one Redis Cluster."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        self.ports = [_cluster_port() for _ in range(masters)]
        self.url = f"redis+cluster://127.0.0.1:{self.ports[0]}"
        self.procs = [subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", str(directory / f"nodes-{port}.conf"), "--dir", str(directory),
             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for port in self.ports]
        for port in self.ports:
            with redis.Redis(port=port) as probe:
                wait_for_redis(probe)
        created = subprocess.run([REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                                  "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True,
                                 timeout=60)
        if created.returncode != 0:
            self.kill()
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-500:]} {created.stderr[-500:]}")
        with redis.Redis(port=self.ports[0], decode_responses=True) as first:
            for _ in range(500):
                if "cluster_state:ok" in first.execute_command("CLUSTER", "INFO"):
                    break
                time.sleep(0.02)
            else:
                raise RuntimeError("the Redis Cluster did not reach state ok")
        self._client: redis.RedisCluster | None = None

    def client(self) -> redis.RedisCluster:
        """One client for the tests of this cluster, closed with it (see RedisServer.client)."""
        if self._client is None:
            self._client = redis.RedisCluster(host="127.0.0.1", port=self.ports[0], decode_responses=True)
        return self._client

    def kill(self) -> None:
        if getattr(self, "_client", None) is not None:
            self._client.close()
            self._client = None
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class WorkerNodeProcess(FnstreamProcess):
    """A real `fnstream worker --cluster URL` subprocess."""

    def __init__(self, url: str, *args: str) -> None:
        super().__init__("worker", "--cluster", url, *FAST, *args, env={"FNSTREAM_LOG": "WARNING"})


class PreviousWorkerNodeProcess(WorkerNodeProcess):
    """A worker as the version before JSON answers streams (tests/support/previous_worker.py)."""

    MODULE = "tests.support.previous_worker"


# -- talking to cluster nodes over HTTP ---------------------------------------------------------
RELAY = {"name": "relay", "handler": "relay.handler", "codePath": str(CLUSTER_FUNCTIONS), "timeout": 30}


async def wait_until(probe, what: str, limit: float = 15.0):
    """Poll `probe()` until it returns something truthy (readiness, not a timing assertion)."""
    return await eventually(probe, what, limit=limit)


async def status(session: aiohttp.ClientSession, base: str) -> dict:
    async with session.get(base + "/cluster/v1/status") as r:
        return await r.json()


async def only_worker(session: aiohttp.ClientSession, base: str) -> dict | None:
    """The one worker the frontend sees live, or None while its heartbeat is late: a loaded machine
    can let the three 0.2 s beats of FAST pass, and a probe should then wait on, not fail."""
    workers = (await status(session, base))["workers"]
    return workers[0] if workers else None


async def workers_serving(session, base: str, name: str, count: int = 1):
    async def probe():
        st = await status(session, base)
        live = [w for w in st["workers"] if name in w["functions"]]
        return live if len(live) >= count else None
    return await wait_until(probe, f"{count} worker(s) serving {name}")


async def deploy(session, base: str, manifest: dict, method: str = "POST") -> dict:
    url = base + "/admin/v1/functions" + (f"/{manifest['name']}" if method == "PUT" else "")
    async with session.request(method, url, json=manifest) as r:
        body = await r.json()
        assert r.status in (200, 201), body
        return body


async def sse(session, base: str, name: str, event: dict, on_event=None):
    """Invoke with SSE; returns (status, [(arrival time, data)])."""
    got = []
    async with session.post(f"{base}/serverless/v1/functions/{name}/invocations", json=event,
                            headers={"Accept": "text/event-stream"}) as r:
        async for ev in iter_sse(r):
            got.append((time.monotonic(), ev["data"]))
            if on_event is not None:
                on_event(ev["data"])
        return r.status, got


def frontend_args(url: str, role: str = "frontend") -> list[str]:
    return ["--cluster", url, *FAST, "-s", f"cluster.role={role}"]


@dataclass
class Serving:
    """A frontend and a worker on one Redis, a client session, and the function deployed."""

    frontend: FnstreamProcess
    worker: WorkerNodeProcess
    session: aiohttp.ClientSession


@contextlib.asynccontextmanager
async def serving(url: str, start_server, start_worker, manifest: dict = RELAY, *, frontend: tuple[str, ...] = (),
                  worker: tuple[str, ...] = ()) -> AsyncIterator[Serving]:
    """The usual setup of a cluster test: a frontend (its `frontend` arguments appended) and a
    worker (`worker`) on `url`, `manifest` deployed and served by the worker once this yields."""
    front = start_server(*frontend_args(url), *frontend)
    node = start_worker(url, *worker)
    async with aiohttp.ClientSession() as s:
        await deploy(s, front.url, manifest)
        await workers_serving(s, front.url, manifest["name"])
        yield Serving(front, node, s)
