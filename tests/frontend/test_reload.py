"""`fnstream serve --reload` as a real server process in a project directory: edits to a handler
or a manifest reach the next call, in-flight calls finish on the old code, and a broken file keeps
the old revision serving while the log names the file and line."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from frontend.scaffold import init_project, new_function
from tests.support.servers import ROOT, free_port

HANDLER = '''import time


def handler(event, context):
    for i in range(int(event.get("count", 1))):
        if i:
            time.sleep(0.3)
        context.get_stream().write({{"version": "{version}", "i": i}})
    return "{version}-" + context.getUserData("flavour", "plain")
'''
MANIFEST = "name: live\nhandler: live.handler\ncodePath: ../functions\nenvironment: {{flavour: {flavour}}}\n"


class ProjectServer:
    """`fnstream serve --reload` with the project directory as its working directory."""

    def __init__(self, project: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen([sys.executable, "-m", "frontend.cli", "serve", "--reload", "--port",
                                      str(self.port)], cwd=project, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
        try:
            wait_for(lambda: self.proc.poll() is None and self._healthy(), "server ready", self.output)
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                return True
        except OSError:
            return False

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def invoke(self, event: dict | None = None) -> object:
        req = urllib.request.Request(self.url + "/serverless/v1/functions/live/invocations",
                                     data=json.dumps(event or {}).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        try:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        finally:
            self.log.close()


def wait_for(check, what: str, details=lambda: "", timeout: float = 15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{details()}")


def write(path: Path, text: str) -> None:
    path.write_text(text)
    # Make sure the poll sees a new mtime even on coarse-timestamp file systems.
    stamp = time.time_ns() + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


@pytest.fixture
def live(tmp_path):
    init_project(tmp_path)
    write(tmp_path / "functions/live.py", HANDLER.format(version="v1"))
    write(tmp_path / "deploy/live.yaml", MANIFEST.format(flavour="plain"))
    server = ProjectServer(tmp_path)
    yield server, tmp_path
    server.stop()


def test_a_handler_edit_reaches_the_next_call_and_a_syntax_error_keeps_the_old_code(live):
    server, project = live
    assert server.invoke() == "v1-plain"
    write(project / "functions/live.py", HANDLER.format(version="v2"))
    wait_for(lambda: server.invoke() == "v2-plain", "the edited handler", server.output)
    assert "functions/live.py changed; live is now revision" in server.output()

    write(project / "functions/live.py", "def handler(event, context):\n    return (\n")
    wait_for(lambda: "keeps serving" in server.output(), "the import error in the log", server.output)
    log = server.output()
    assert f"{project / 'functions/live.py'}:" in log.split("keeps serving")[-1].splitlines()[0]
    assert "SyntaxError" in log
    assert server.invoke() == "v2-plain"  # the old revision still answers

    write(project / "functions/live.py", HANDLER.format(version="v3"))
    wait_for(lambda: server.invoke() == "v3-plain", "the fixed handler", server.output)


def test_a_manifest_edit_redeploys_and_a_bad_manifest_keeps_the_old_revision(live):
    server, project = live
    write(project / "deploy/live.yaml", MANIFEST.format(flavour="salty"))
    wait_for(lambda: server.invoke() == "v1-salty", "the edited manifest", server.output)
    write(project / "deploy/live.yaml", "name: live\nhandler: live.handler\ncodePath: ../functions\ntimeout: -1\n")
    wait_for(lambda: "not reloaded" in server.output(), "the manifest error in the log", server.output)
    assert "deploy/live.yaml" in server.output() and "'timeout'" in server.output()
    assert server.invoke() == "v1-salty"


def test_an_invocation_in_flight_finishes_on_the_old_code(live):
    server, project = live
    req = urllib.request.Request(server.url + "/serverless/v1/functions/live/invocations",
                                 data=b'{"count": 6}', method="POST", headers={"Accept": "text/event-stream"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        first = resp.readline() + resp.readline()
        assert b'"version":"v1"' in first
        write(project / "functions/live.py", HANDLER.format(version="v2"))
        wait_for(lambda: "live is now revision" in server.output(), "the redeploy", server.output)
        rest = resp.read().decode()
    assert rest.count('"version":"v1"') == 5 and "v2" not in rest and '"v1-plain"' in rest
    assert server.invoke() == "v2-plain"


@pytest.mark.skipif(shutil.which("javac") is None or not Path("/usr/share/java/gson.jar").is_file(),
                    reason="needs a JDK (javac) and gson (libgoogle-gson-java)")
def test_a_java_source_edit_is_compiled_and_reaches_the_next_call(tmp_path):
    init_project(tmp_path)
    new_function(tmp_path, "jlive", "java")
    source = tmp_path / "functions/jlive/jlive/Jlive.java"
    server = ProjectServer(tmp_path)

    def call() -> object:
        req = urllib.request.Request(server.url + "/serverless/v1/functions/jlive/invocations",
                                     data=b'{"count": 0}', method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    try:
        assert call() == {"count": 0, "function": "jlive"}
        write(source, source.read_text().replace('result.addProperty("count", count);',
                                                 'result.addProperty("count", count + 100);'))
        wait_for(lambda: call() == {"count": 100, "function": "jlive"}, "the edited Java handler", server.output)
        write(source, source.read_text().replace("count + 100)", "count + )"))  # a compile error
        wait_for(lambda: "Jlive.java, line" in server.output(), "the compile error in the log", server.output)
        assert call() == {"count": 100, "function": "jlive"}  # the old revision keeps serving
    finally:
        server.stop()


def test_a_helper_edit_redeploys_only_the_functions_importing_it(tmp_path):
    """Functions share functions/: an edit of a module `live` imports redeploys `live` alone (with the
    helper's new code, not the cached module), and an edit of hello.py redeploys `hello` alone."""
    init_project(tmp_path)
    write(tmp_path / "functions/live_words.py", 'WORD = "v1"\n')
    write(tmp_path / "functions/live.py", "from live_words import WORD\n\n\n"
                                          "def handler(event, context):\n    return WORD\n")
    write(tmp_path / "deploy/live.yaml", "name: live\nhandler: live.handler\ncodePath: ../functions\n")
    server = ProjectServer(tmp_path)
    try:
        assert server.invoke() == "v1"
        write(tmp_path / "functions/live_words.py", 'WORD = "v2"\n')
        wait_for(lambda: server.invoke() == "v2", "the edited helper", server.output)
        assert "functions/live_words.py changed; live is now revision" in server.output()
        write(tmp_path / "functions/hello.py", (tmp_path / "functions/hello.py").read_text() + "\n")
        wait_for(lambda: "hello is now revision" in server.output(), "the hello redeploy", server.output)
        time.sleep(1)  # two more polls: nothing else is redeployed
        log = server.output()
        assert log.count("is now revision") == 2, log
    finally:
        server.stop()


def test_code_files_follow_imports_inside_the_code_path(tmp_path):
    from frontend.reload_deps import code_files
    from runtime.manifest import FunctionSpec

    (tmp_path / "kit").mkdir()
    (tmp_path / "kit/__init__.py").write_text("from .parts import x\n")
    (tmp_path / "kit/parts.py").write_text("x = 1\n")
    (tmp_path / "kit/extra.py").write_text("")
    (tmp_path / "util.py").write_text("import json\n")
    (tmp_path / "main.py").write_text("import os\nimport kit\n\ndef handler(e, c):\n    from util import dumps\n")
    (tmp_path / "init.py").write_text("")
    (tmp_path / "unrelated.py").write_text("")
    spec = FunctionSpec(name="m", handler="main.handler", initializer="init.setup", codePath=str(tmp_path))
    assert code_files(spec) == {tmp_path / f for f in ("main.py", "init.py", "util.py", "kit/__init__.py",
                                                       "kit/parts.py", "kit/extra.py")}
