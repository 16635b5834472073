"""Runaway `def` handlers: how the rest of the server fares while one function's calls spin.

A figure, not a test. Starts a real `fnstream serve`, deploys `bench-spin` (a plain `def` handler
spinning in pure Python; timeout `--timeout`) and `bench-echo`, sends `--spinners` spinning calls at
once and, while they run, JSON calls of `bench-echo` back to back. Reports the echo latency (p50,
p99, max) while the spinners run, when each spinning call was answered 504 against its timeout
(issue 24's goal: every 504 within timeout + 0.5 s, echo p50 ≤ 50 ms with 30 spinners), and
healthz latency after (threads that overran must not keep the server slow).
Run: `.venv/bin/python -m bench.runaway [--spinners 30] [--timeout 1] [--seconds 3]`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import aiohttp

from bench.client import percentile
from bench.cluster import CODE_ROOTS, QUIET, ROOT, _port, _wait_http

__all__ = ("main", "measure")


async def measure(base: str, spinners: int, timeout: float, seconds: float) -> dict[str, float]:
    invoke = f"{base}/serverless/v1/functions/{{}}/invocations"
    async with aiohttp.ClientSession() as s:
        spin = {"name": "bench-spin", "handler": "bench_handlers.spin", "codePath": str(ROOT / "bench" / "functions"),
                "timeout": timeout, "concurrency": 1000}
        async with s.post(f"{base}/admin/v1/functions", data=json.dumps(spin)) as r:
            assert r.status in (200, 201), await r.text()

        async def one_spin() -> float:
            t0 = time.monotonic()
            async with s.post(invoke.format("bench-spin"), json={}) as r:
                await r.read()
                assert r.status == 504, r.status
            return time.monotonic() - t0

        spins = [asyncio.create_task(one_spin()) for _ in range(spinners)]
        echo: list[float] = []
        end = time.monotonic() + min(seconds, timeout)
        while time.monotonic() < end:
            t0 = time.monotonic()
            async with s.post(invoke.format("bench-echo"), json={"i": len(echo)}) as r:
                await r.read()
            echo.append(time.monotonic() - t0)
        answered = await asyncio.gather(*spins)
        await asyncio.sleep(1.5)
        health = []
        for _ in range(50):
            t0 = time.monotonic()
            async with s.get(f"{base}/healthz") as r:
                await r.read()
            health.append(time.monotonic() - t0)
    return {"echo_calls": len(echo), "echo_p50_ms": percentile(echo, 50) * 1000,
            "echo_p99_ms": percentile(echo, 99) * 1000, "echo_max_ms": max(echo) * 1000,
            "spin_504_max_over_timeout_s": max(answered) - timeout,
            "healthz_after_p50_ms": percentile(health, 50) * 1000, "healthz_after_max_ms": max(health) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spinners", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long echo is measured (≤ timeout)")
    args = parser.parse_args()
    port = _port()
    bench = ROOT / "bench"
    proc = subprocess.Popen([sys.executable, "-m", "frontend.cli", "serve", "--config", str(bench / "config.yaml"),
                             "--port", str(port), "-s", CODE_ROOTS, "-s", f"runtime.deployDir={bench / 'deploy'}",
                             "-s", "jobs.store=memory"], cwd=ROOT, env=QUIET)
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz")
        result = asyncio.run(measure(f"http://127.0.0.1:{port}", args.spinners, args.timeout, args.seconds))
        print(json.dumps({k: round(v, 2) for k, v in result.items()}))
    finally:
        proc.terminate()
        proc.wait(15)


if __name__ == "__main__":
    main()
