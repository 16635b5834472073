"""The console's invoke tool reads on after a dropped connection (frontend/console/console.js
`followStream`), run in node against a real server: a function with onDisconnect: continue, its
SSE connection cut after two events; the console reconnects with Last-Event-ID and shows every
later event once, then the end."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.support.servers import FUNCTIONS, ROOT, ServerProcess, fn

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node")


@pytest.mark.allow_blocking
def test_the_console_reads_on_after_a_drop(deploy_dir):
    deploy = deploy_dir({**fn("kept-ticker", "ticker.handler", onDisconnect="continue"), "codePath": str(FUNCTIONS)})
    server = ServerProcess("--deploy-dir", str(deploy), "-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS)])}")
    try:
        done = subprocess.run([NODE, str(ROOT / "tests/frontend/console_resume.js"),
                               str(ROOT / "frontend/console/console.js"), server.url, "kept-ticker",
                               json.dumps({"count": 6, "delay_ms": 100})], capture_output=True, text=True, timeout=60)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    events = out["events"]
    assert out["retries"] == [1] and out["done"]  # one reconnect, then to the end
    assert [e["id"] for e in events] == [str(i) for i in range(1, 8)] + [None]  # each event once
    assert [json.loads(e["data"]).get("tick") for e in events[:6]] == [1, 2, 3, 4, 5, 6]
    assert json.loads(events[6]["data"]) == {"ticks": 6} and events[7]["data"] == "[DONE]"
