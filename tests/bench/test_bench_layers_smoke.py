"""bench.layers still takes its layers out: every variant's server starts with the layer patched
away and answers the invoke scenario whole (and its idle streams, where it still streams), and a
variant without the front door's fast lane and the middleware chain really has neither (a bad body
is no longer answered 400 by the lane or the error middleware: the route's error reaches the
listener, whose answer is a 500); without the fast lane alone the app still answers 400. No figure
is asserted (they come from the script)."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from bench.layers import LAYERS
from bench.servers import ROOT


def test_bench_layers_runs_every_layer_out():
    out = subprocess.run([sys.executable, "-m", "bench.layers", "--variants", *LAYERS, "--trials", "1",
                          "--requests", "300", "--memory"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| fnstream without ")]
    assert [r.split("|")[1].strip() for r in rows] == [f"fnstream without {layer}" for layer in LAYERS]


@pytest.mark.parametrize("layers, status", [("", 400), ("frontdoor", 400), ("frontdoor,middleware", 500)])
def test_a_layer_taken_out_is_gone(tmp_path, layers, status):
    from bench.servers import BENCH, ServerProc, free_port

    port = free_port()
    cmd = [sys.executable, "-m", "bench.layers", "--serve", layers, "serve", "--config",
           str(BENCH / "config.yaml"), "--port", str(port)]
    server = ServerProc("layers", cmd, port, tmp_path / "server.log", None, {"FNSTREAM_LOG": "WARNING"}, "/healthz")
    try:
        async def post() -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /serverless/v1/functions/bench-echo-async/invocations HTTP/1.1\r\nHost: localhost\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1\r\nConnection: close\r\n\r\n{")
            data = await reader.read()
            writer.close()
            return int(data.split()[1])
        assert asyncio.run(asyncio.wait_for(post(), 30)) == status
    finally:
        server.stop()
