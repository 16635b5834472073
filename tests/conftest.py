"""Shared fixtures: an in-process app client and a real `fnstream serve` process on a free port."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from frontend.app import SERVER_KWARGS, build_app
from runtime.config import load_config

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ROOT / "functions"
DEPLOY = ROOT / "deploy"


def make_config(**sections):
    """The shipped default config with `sections` merged in (dotted keys allowed)."""
    overrides = [f"{k}={json.dumps(v)}" for k, v in sections.items()]
    return load_config(ROOT / "config" / "default.yaml", overrides)


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FnstreamProcess:
    """A real `python -m frontend.cli ...` subprocess whose output goes to a file.

    A file, not a pipe: a pipe nobody reads fills up and freezes a busy server.
    """

    def __init__(self, *cli_args: str, env: dict | None = None) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "frontend.cli", *cli_args], cwd=ROOT,
                                     env={**os.environ, **(env or {})}, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)
        self.pid = self.proc.pid

    def output(self) -> str:
        if self.log.closed:
            return self._output
        self.log.seek(0)
        return self.log.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> str:
        """SIGTERM, then SIGKILL after 10 s; returns everything the process printed (the log is closed)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if not self.log.closed:
            self._output = self.output()
            self.log.close()
        return self._output


class ServerProcess(FnstreamProcess):
    """A real `fnstream serve` subprocess; `url` is its base URL."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__("serve", "--port", str(self.port), *args, env=env)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.stop()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("server did not become ready")


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


HANDLERS = Path(__file__).resolve().parent / "handlers"


def fn(name: str, handler: str, **fields) -> dict:
    """A manifest entry for a test handler in tests/handlers."""
    return {"name": name, "handler": handler, "codePath": str(HANDLERS), **fields}


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


def test_config(deploy: Path | None = None, **overrides):
    """The shipped config, code roots widened to tests/handlers, deploying `deploy` (or nothing)."""
    sections = {"runtime.codeRoots": [str(FUNCTIONS), str(HANDLERS)],
                "runtime.deployDir": str(deploy) if deploy else None}
    sections.update(overrides)
    return make_config(**sections)


test_config.__test__ = False  # a helper, not a test


async def read_events(resp, limit: int | None = None) -> list[tuple[float, dict]]:
    """Parse SSE from a response as it arrives: [(arrival monotonic time, event)]."""
    from frontend.client import iter_sse

    out = []
    async for ev in iter_sse(resp):
        out.append((time.monotonic(), ev))
        if limit is not None and len(out) >= limit:
            break
    return out
