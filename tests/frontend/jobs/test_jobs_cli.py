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
