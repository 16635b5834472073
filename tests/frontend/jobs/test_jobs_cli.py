"""`fnstream invoke NAME --async` prints the job id; `fnstream job ID [--follow]` shows or follows it."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.support.servers import ROOT


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "frontend.cli", *args, "--url", url], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_invoke_async_and_follow(server):
    done = cli("invoke", "ticker", "--async", "--data", '{"count": 8, "delay_ms": 400}', url=server.url)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert len(job_id) == 36
    arrivals = []
    with subprocess.Popen([sys.executable, "-m", "frontend.cli", "job", job_id, "--follow", "--url", server.url],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            arrivals.append((time.monotonic(), line.rstrip("\n")))
        assert proc.wait(30) == 0
    assert len(arrivals) == 9 and arrivals[-1][0] - arrivals[0][0] > 0.3  # printed as they came
    shown = cli("job", job_id, url=server.url)
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "COMPLETED"
    missing = cli("job", "nope", url=server.url)
    assert missing.returncode == 1 and json.loads(missing.stdout)["code"] == 200404


def test_invoke_async_follow_submits_and_prints_items_as_they_come(server):
    arrivals = []
    with subprocess.Popen([sys.executable, "-m", "frontend.cli", "invoke", "ticker", "--async", "--follow",
                           "--data", '{"count": 6, "delay_ms": 300}', "--url", server.url],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:  # stdout carries only the output items
            arrivals.append((time.monotonic(), line.rstrip("\n")))
        assert proc.wait(30) == 0
        said = proc.stderr.read()
    assert len(arrivals) == 7 and arrivals[-1][0] - arrivals[0][0] > 0.3  # printed as they came
    job_id = said.splitlines()[0]
    assert len(job_id) == 36 and "COMPLETED" in said  # the id, then how it ended, on stderr


def test_quick_commands_import_neither_the_app_nor_the_http_client():
    # `fnstream --help` took 0.65 s importing the whole server; the parser needs none of it.
    code = ("import sys; from frontend.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('aiohttp', 'pydantic', 'frontend.app', 'runtime.streams') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done
