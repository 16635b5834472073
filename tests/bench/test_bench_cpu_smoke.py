"""bench.cpu still measures: a real `fnstream serve` (the bench config) answers a fixed load whole
and its CPU time per request is read from /proc. No figure is asserted (they come from the script)."""
from __future__ import annotations

import asyncio

from bench.client import Target
from bench.cpu import measure_cpu
from bench.servers import TARGETS, start_target


def test_bench_cpu_measures_a_fixed_load(tmp_path):
    server = start_target("fnstream", tmp_path, None)
    try:
        for name in ("fnstream-async", "fnstream-thread"):
            target = Target(name, "127.0.0.1", server.port, None, TARGETS[name][2])
            result = asyncio.run(asyncio.wait_for(measure_cpu(target, server, 300, 8), 60))
            assert result["requests"] == 300 and result["errors"] == 0
            assert result["us_per_request"] >= 0 and result["p99_ms"] >= result["p50_ms"] > 0
    finally:
        server.stop()
