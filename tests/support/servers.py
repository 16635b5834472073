"""Helpers shared by the tests: config builders, manifests of test handlers, real server processes,
and an SSE reader that timestamps each event as it arrives."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer
from aiohttp.web_runner import BaseRunner

from frontend.keys import CONFIG
from frontend.server import FnstreamRunner
from runtime.config import load_config

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ROOT / "functions"
DEPLOY = ROOT / "deploy"
TESTS = ROOT / "tests"
HANDLERS = TESTS / "handlers"
PROCESS_FUNCTIONS = TESTS / "process_functions"
# The exact SSE answer of the bundled `hello` function.
HELLO_BYTES = (b'id: 1\ndata: {"event": "this is a stream"}\n\n'
               b'id: 2\ndata: "ok"\n\n'
               b"data: [DONE]\n\n")


_DATA_DIRS = Path(tempfile.mkdtemp(prefix="fnstream-test-data-"))
atexit.register(shutil.rmtree, _DATA_DIRS, ignore_errors=True)


def fresh_data_dir() -> str:
    """A data directory (runtime.dataDir) of its own, outside the checkout: no test recovers another
    test's jobs, and none reads or writes the checkout's data (a `./scripts/serve` may be using it)."""
    return tempfile.mkdtemp(dir=_DATA_DIRS)


def make_config(**sections):
    """The shipped default config with `sections` merged in (dotted keys allowed); a fresh data dir."""
    sections.setdefault("runtime.dataDir", fresh_data_dir())
    overrides = [f"{k}={json.dumps(v)}" for k, v in sections.items()]
    return load_config(ROOT / "config" / "default.yaml", overrides)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FnstreamProcess:
    """A real `python -m frontend.cli ...` subprocess whose output goes to a file.

    A file, not a pipe: a pipe nobody reads fills up and freezes a busy server.
    """

    MODULE = "frontend.cli"  # what `python -m` runs (a test may run a patched CLI)

    def __init__(self, *cli_args: str, env: dict | None = None, cwd: Path = ROOT,
                 own_data_dir: bool = True) -> None:
        if own_data_dir and cli_args[:1] in (("serve",), ("worker",)) and not any("runtime.dataDir" in a
                                                                                 for a in cli_args):
            cli_args = (*cli_args, "-s", f"runtime.dataDir={fresh_data_dir()}")
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen([sys.executable, "-m", self.MODULE, *cli_args], cwd=cwd,
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

    def __init__(self, *args: str, env: dict | None = None, cwd: Path = ROOT, own_data_dir: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__("serve", "--port", str(self.port), *args, env=env, cwd=cwd, own_data_dir=own_data_dir)
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


class FnstreamTestServer(TestServer):
    """An app served as `fnstream serve` serves it: by FnstreamRunner (frontend.limits, the front door's
    fast lane), where aiohttp's TestServer would use a plain AppRunner (the app path only).
    `fast_lane=False`: the same listener, every request through the app (the app path's door)."""

    def __init__(self, app: Any, *, fast_lane: bool = True, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.fast_lane = fast_lane

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return FnstreamRunner(self.app, self.app[CONFIG].frontend.limits, fast_lane=self.fast_lane, **kwargs)


def fn(name: str, handler: str, **fields) -> dict:
    """A manifest entry for a test handler in tests/handlers."""
    return {"name": name, "handler": handler, "codePath": str(HANDLERS), **fields}


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


def assert_live(stamps: list[float], producing: float) -> None:
    """Assert that events arrived spread over the producer's run, not in one burst at its end.

    `producing` is how long the producer takes from its first write to its last; the arrivals must
    span at least half of it. A stream held back until the end has no spread at all, while a slow
    start on a loaded machine (which a "first event before 40% of the total" check counts against
    the stream) delays every arrival alike and leaves the spread whole."""
    spread = stamps[-1] - stamps[0]
    assert spread >= producing / 2, f"{len(stamps)} events arrived within {spread:.3f} s of a {producing:g} s run"
