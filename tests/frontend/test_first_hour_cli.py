"""A new user's first commands say what is true: `fnstream new --template openai` names the address
the project's server listens on and deploys without a restart, and `init`'s test hint runs."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import urllib.request

from frontend import testcmd
from frontend.scaffold import init_project
from tests.support.servers import ROOT, FnstreamProcess, free_port


def fnstream(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "frontend.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def _wait_healthy(url: str, server: FnstreamProcess) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.output()
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("server not ready:\n" + server.output())


def test_openai_template_hint_names_the_configured_port_and_works_without_a_restart(tmp_path):
    init_project(tmp_path)
    port = free_port()
    (tmp_path / "config/default.yaml").write_text(
        f"frontend: {{host: 127.0.0.1, port: {port}}}\nruntime: {{dataDir: {tmp_path / '.data'}}}\n")
    server = FnstreamProcess("serve", cwd=tmp_path, own_data_dir=False)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, server)
        out = fnstream("new", "bot", "--template", "openai", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "8888" not in out.stdout and "chatFunction" not in out.stdout and "no restart" in out.stdout
        deploy = re.search(r"fnstream (deploy deploy/bot\.yaml --url \S+)", out.stdout)
        curl = re.search(r"^  (curl -N .*)$", out.stdout, flags=re.M)
        assert deploy and curl, out.stdout
        assert f"--url {url}" in deploy.group(1) and f"{url}/v1/chat/completions" in curl.group(1)
        deployed = fnstream(*deploy.group(1).split(), cwd=tmp_path)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        answer = subprocess.run(["bash", "-c", curl.group(1)], capture_output=True, text=True, timeout=30)
        assert answer.returncode == 0 and "data: [DONE]" in answer.stdout, answer.stdout + answer.stderr
        words = re.findall(r'"content": ?"([^"]*)"', answer.stdout)
        assert "".join(words) == "You said: hi"
    finally:
        server.stop()


def test_init_hint_runs_its_test_with_fnstream_test(tmp_path):
    out = fnstream("init", cwd=tmp_path)
    assert "fnstream test" in out.stdout and "pytest tests" not in out.stdout
    run = fnstream("test", "--", "-q", "-p", "no:cacheprovider", "tests", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_fnstream_test_without_pytest_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(testcmd, "find_spec", lambda name: None)
    code = testcmd.cmd_test(argparse.Namespace(dir=str(tmp_path), paths=[]))
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "pip install pytest" in err and "'fnstream[test]'" in err
