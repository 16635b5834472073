"""Fixtures shared by every test: an in-process app client, real `fnstream serve` processes, deploy dirs.

Plain helpers live in `tests.support`; fixtures are only ever requested by name."""
from __future__ import annotations

import pytest

from frontend.app import SERVER_KWARGS, build_app
from tests.support.cluster import RedisClusterServers, RedisServer, WorkerProcess
from tests.support.servers import ServerProcess, make_config


@pytest.fixture
def make_client(aiohttp_client):
    """Factory: an in-process test client of a fresh app built from config overrides."""

    async def factory(config=None, **overrides):
        cfg = config or make_config(**overrides)
        app = build_app(cfg)
        return await aiohttp_client(app, server_kwargs=SERVER_KWARGS)

    return factory


@pytest.fixture
async def client(make_client):
    return await make_client()


@pytest.fixture
def start_server():
    """Factory: start real servers (extra CLI args); all are stopped after the test."""
    servers: list[ServerProcess] = []

    def factory(*args: str, env: dict | None = None) -> ServerProcess:
        server = ServerProcess(*args, env=env)
        servers.append(server)
        return server

    yield factory
    for s in servers:
        s.stop()


@pytest.fixture
def server(start_server):
    """A real server with the shipped config and bundled functions."""
    return start_server()


@pytest.fixture
def deploy_dir(tmp_path):
    """Factory: write manifests (lists of `fn(...)` dicts) into a fresh deploy directory."""
    import yaml

    directory = tmp_path / "deploy"
    directory.mkdir()

    def factory(*functions: dict, file: str = "functions.yaml") -> Path:
        (directory / file).write_text(yaml.safe_dump(list(functions)))
        return directory

    return factory


@pytest.fixture
def redis_server():
    server = RedisServer()
    yield server
    server.kill()


@pytest.fixture
def redis_cluster(tmp_path):
    servers = RedisClusterServers(tmp_path)
    yield servers
    servers.kill()


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
