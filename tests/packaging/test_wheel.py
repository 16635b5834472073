"""A regular (not editable) install works on its own: build the sdist from the tree, the wheel from
the sdist, install the wheel into a fresh venv outside the tree, and run the new user's flow there:
`fnstream serve` in an empty directory, `fnstream init`, the project's own test, `fnstream new`,
`serve` and `invoke`.

Offline: the build uses this venv's setuptools, and the fresh venv reaches the installed
dependencies (aiohttp, pydantic, pytest, ...) through a .pth line naming this venv's site-packages,
which holds no `runtime` or `frontend` (the dev install is editable, through a finder that .pth
lines do not run) — fnstream itself comes only from the wheel.
"""
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.support.servers import ROOT, free_port

BUILD = "from setuptools import build_meta as b; import sys; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def run(*args, cwd, env=None, timeout=120):
    out = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{args}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def copy_tree(dest: Path) -> None:
    """The files git would ship (tracked and new, not ignored) — no build/ or egg-info in the tree."""
    listed = run("git", "ls-files", "-co", "--exclude-standard", "-z", cwd=ROOT).split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("build")
    src, dist = work / "src", work / "dist"
    src.mkdir()
    dist.mkdir()
    copy_tree(src)
    sdist = dist / run(sys.executable, "-c", BUILD, "build_sdist", dist, cwd=src).strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        tar.extractall(work / "unpacked", filter="data")
    top = sdist.name.removesuffix(".tar.gz")
    for rel in ("config/default.yaml", "deploy/hello.yaml", "functions/hello.py", "functions/chat_backends/shapes.py"):
        assert f"{top}/{rel}" in names
    unpacked = work / "unpacked" / top
    return dist / run(sys.executable, "-c", BUILD, "build_wheel", dist, cwd=unpacked).strip().splitlines()[-1]


def test_the_wheel_carries_the_one_default_config_and_the_examples(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert z.read("runtime/_defaults/default.yaml") == (ROOT / "config/default.yaml").read_bytes()
        for path in (ROOT / "deploy").glob("*.yaml"):
            assert z.read(f"frontend/_examples/deploy/{path.name}") == path.read_bytes()
        for path in [*(ROOT / "functions").rglob("*.py"), *(ROOT / "functions").rglob("*.java")]:
            rel = path.relative_to(ROOT / "functions").as_posix()
            assert z.read(f"frontend/_examples/functions/{rel}") == path.read_bytes()
        sdk = ROOT / "runtime/java/sdk"  # the Java SDK's sources, compiled on first use
        for path in sdk.rglob("*.java"):
            assert z.read(f"runtime/java/sdk/{path.relative_to(sdk).as_posix()}") == path.read_bytes()
        assert "runtime/java/sdk/org/yuanrong/services/runtime/Context.java" in names
    assert not any(n.startswith(("tests/", "bench/", "config/", "deploy/", "functions/")) for n in names)


class Served:
    def __init__(self, fnstream: Path, cwd: Path, env: dict) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = cwd / f"serve-{self.port}.log"
        with self.log.open("w") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([fnstream, "serve", "--port", str(self.port)], cwd=cwd, env=env,
                                         stdout=out, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("not ready:\n" + self.log.read_text())

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text()


def test_installed_wheel_serves_and_scaffolds_outside_the_tree(wheel, tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    py, fnstream = venv / "bin/python", venv / "bin/fnstream"
    site = Path(run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "FNSTREAM_URL": ""}
    where = run(py, "-c", "import runtime, frontend; print(runtime.__file__, frontend.__file__)", cwd=tmp_path, env=env)
    assert all(p.startswith(str(site)) for p in where.split()), where

    empty = tmp_path / "empty"
    empty.mkdir()
    server = Served(fnstream, empty, env)
    try:
        with urllib.request.urlopen(server.url + "/admin/v1/functions") as r:
            assert json.loads(r.read())["functions"] == []  # nothing deployed (openYuanrong's keys beside)
    finally:
        log = server.stop()
    assert "no functions deployed" in log and "fnstream new" in log

    out = run(fnstream, "init", "proj", cwd=tmp_path, env=env)
    assert "created proj/config/default.yaml" in out and "cd proj && fnstream serve" in out
    proj = tmp_path / "proj"
    tests = run(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=proj, env=env)
    assert "1 passed" in tests
    out = run(fnstream, "new", "counter", "--template", "generator", cwd=proj, env=env)
    assert "created functions/counter.py" in out and "fnstream invoke counter --stream" in out

    server = Served(fnstream, proj, env)
    try:
        lines = run(fnstream, "invoke", "counter", "--stream", "--data", '{"count": 2}', "--url", server.url,
                    cwd=proj, env=env).splitlines()
        assert lines == ['{"n":1,"of":2}', '{"n":2,"of":2}', "[DONE]"]
        lines = run(fnstream, "invoke", "hello", "--stream", "--url", server.url, cwd=proj, env=env).splitlines()
        assert lines == ['{"event": "this is a stream"}', '"ok"', "[DONE]"]
    finally:
        server.stop()

    examples = tmp_path / "examples"
    run(fnstream, "init", "--examples", examples, cwd=tmp_path, env=env)
    assert (examples / "functions/chat_backends/standin.py").read_bytes() == \
        (ROOT / "functions/chat_backends/standin.py").read_bytes()
    os.remove(site / "zz_test_dependencies.pth")
