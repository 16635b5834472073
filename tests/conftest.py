"""Fixtures shared by every test: an in-process app client, real `fnstream serve` processes, deploy dirs.

Plain helpers live in `tests.support`; fixtures are only ever requested by name."""
from __future__ import annotations

import faulthandler
from collections.abc import Iterator
from pathlib import Path

import pytest
from blockbuster import blockbuster_ctx
from hypothesis import settings

from frontend.app import build_app
from tests.support.cluster import NO_REDIS, RedisClusterServers, RedisServer, WorkerNodeProcess, require_redis_server
from tests.support.servers import ROOT, FnstreamTestServer, ServerProcess, make_config

# Property tests: no example database in the tree, and no per-example deadline (2 shared cores).
settings.register_profile("fnstream", database=None, deadline=None)
settings.load_profile("fnstream")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--require-redis", action="store_true",
                     help="fail the run if any test skipped because redis-server is missing (CI sets it)")


def _skipped_for_redis(config: pytest.Config) -> list[str]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    return [r.nodeid for r in skipped if NO_REDIS in str(r.longrepr)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under --require-redis a Redis test that skipped fails the run: CI must have run them all."""
    if session.config.getoption("--require-redis") and _skipped_for_redis(session.config):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A run whose process cannot exit fails instead of hanging CI: if a test left a thread that
    never ends (the interpreter waits for non-daemon threads at exit), every thread's stack is
    printed and the process exits 1 after EXIT_GRACE seconds."""
    faulthandler.dump_traceback_later(EXIT_GRACE, exit=True)


EXIT_GRACE = 60


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    missed = _skipped_for_redis(config)
    if config.getoption("--require-redis") and missed:
        terminalreporter.write_line(f"--require-redis: {len(missed)} Redis test(s) skipped ({NO_REDIS}): "
                                    "the run fails", red=True)


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True, scope="session")
def checkout_data_untouched() -> Iterator[None]:
    """Tests never read or write the checkout's data (a `./scripts/serve` may be using it): every
    server and app a test builds has a data directory of its own (tests/support/servers.py). A job
    store opened inside the checkout fails its test at once, and the run fails if the checkout's
    config/ changed (where the job store used to live)."""
    from runtime.jobs import store

    config_before = _snapshot(ROOT / "config")
    original = store.SqliteJobStore.__init__

    def guarded(self, path, *args, **kwargs):
        assert not Path(path).resolve().is_relative_to(ROOT), f"a test opened a job store in the checkout: {path}"
        original(self, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store.SqliteJobStore, "__init__", guarded)
        yield
    assert _snapshot(ROOT / "config") == config_before, "the tests changed the checkout's config/"


@pytest.fixture(autouse=True)
def blockbuster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test whose runtime/frontend code makes a blocking call (file, socket, sleep, lock)
    on the event loop, as aiohttp's own suite does. `@pytest.mark.allow_blocking` opts out."""
    if request.node.get_closest_marker("allow_blocking"):
        yield
        return
    with blockbuster_ctx(["runtime", "frontend"]) as bb:
        for function in bb.functions.values():
            # Test set-up, not serving: building a config and an app before the server takes requests.
            function.can_block_in("tests/support/servers.py", "make_config")
            function.can_block_in("frontend/app.py", "build_app")
            function.can_block_in("runtime/registry.py", "__init__")  # built once, at start-up
            function.can_block_in("runtime/node.py", "__init__")  # the composition root (build_app's), too
            # redis-py reads its own package metadata (os.stat) for each new connection.
            function.can_block_in("redis/utils.py", "get_lib_version")
            # Known and accepted: cancel/stop control frames (a few bytes) go to a process worker
            # from the loop on its blocking socket, which the worker's reader thread always drains.
            function.can_block_in("runtime/process/pool.py", {"cancel", "stop"})
            # Frames sent from the loop to a process worker use send(MSG_DONTWAIT), which never waits:
            # what does not fit goes from a thread (runtime/process/protocol.py try_send_bytes).
            function.can_block_in("runtime/process/protocol.py", "try_send_bytes")
            # The loop-lag monitor reads its thread's schedstat, a procfs file the kernel fills in
            # memory, every 250 ms: never a wait on a disk.
            function.can_block_in("runtime/limits.py", "_runqueue_wait")
        yield


@pytest.fixture
def make_client(aiohttp_client):
    """Factory: an in-process test client of a fresh app built from config overrides, served as
    `fnstream serve` serves it (FnstreamRunner: limits and the front door's fast lane)."""

    async def factory(config=None, **overrides):
        cfg = config or make_config(**overrides)
        return await aiohttp_client(FnstreamTestServer(build_app(cfg)))

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
    require_redis_server()
    server = RedisServer()
    yield server
    server.kill()


@pytest.fixture
def redis_cluster(tmp_path):
    require_redis_server()
    servers = RedisClusterServers(tmp_path)
    yield servers
    servers.kill()


@pytest.fixture
def start_worker():
    workers: list[WorkerNodeProcess] = []

    def factory(url: str, *args: str) -> WorkerNodeProcess:
        w = WorkerNodeProcess(url, *args)
        workers.append(w)
        return w

    yield factory
    for w in workers:
        w.stop()
