"""Jobs: submissions per second and submit → first `/events` item latency, on a real `fnstream serve`.

A figure, not a test. Submits `--jobs` RunPod `/run` jobs of `bench-echo-async` from 32 clients
at once (each stored in SQLite before its answer, or in memory with `--store memory`) and waits
until all completed; then `--samples` times submits one `bench-stream` job (openYuanrong
`X-Invoke-Type: async`) and measures until its first item arrives on `/serverless/v1/jobs/{id}/events`.
Run: `.venv/bin/python -m bench.jobs [--jobs N] [--samples N] [--store sqlite|memory]`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.client import percentile
from bench.cluster import QUIET, ROOT, _port, _wait_http

__all__ = ("main", "measure")

BENCH = ROOT / "bench"


async def _submit_all(base: str, n: int, concurrency: int = 32) -> tuple[float, float]:
    """(submitted/s, completed/s) for `n` /run jobs."""
    ids: list[str] = []
    todo = iter(range(n))
    async with aiohttp.ClientSession() as s:
        async def client() -> None:
            for _ in todo:
                async with s.post(f"{base}/v2/bench-echo-async/run", json={"input": {"x": 1}}) as r:
                    if r.status != 200:
                        raise RuntimeError(f"/run answered {r.status}: {await r.text()}")
                    ids.append((await r.json())["id"])

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        submitted = time.perf_counter() - start
        while True:
            async with s.get(f"{base}/v2/bench-echo-async/health") as r:
                jobs = (await r.json())["jobs"]
            if jobs["inQueue"] == 0 and jobs["inProgress"] == 0:
                break
            await asyncio.sleep(0.01)
        done = time.perf_counter() - start
    return n / submitted, n / done


async def _first_item_latency(base: str, samples: int) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as s:
        for _ in range(samples):
            start = time.perf_counter()
            async with s.post(f"{base}/serverless/v1/functions/bench-stream/invocations", json={"count": 1},
                              headers={"X-Invoke-Type": "async"}) as r:
                request_id = (await r.json())["requestId"]
            async with s.get(f"{base}/serverless/v1/jobs/{request_id}/events") as r:
                async for line in r.content:
                    if line.startswith(b"data:"):
                        out.append(time.perf_counter() - start)
                        break
    return out


def measure(jobs: int, samples: int, store: str) -> dict[str, float | str]:
    port = _port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "frontend.cli", "serve", "--config", str(BENCH / "config.yaml"),
                                 "--port", str(port), "-s", f"jobs.store={store}",
                                 "-s", f"jobs.path={Path(tmp) / 'jobs.sqlite3'}", "-s", f"jobs.maxQueued={jobs + 10}"],
                                cwd=ROOT, env=QUIET, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_http(base + "/healthz")
            submitted, completed = asyncio.run(_submit_all(base, jobs))
            latency = asyncio.run(_first_item_latency(base, samples))
        finally:
            proc.terminate()
            proc.wait(20)
    return {"store": store, "jobs_submitted_per_s": round(submitted), "jobs_completed_per_s": round(completed),
            "first_item_ms_p50": round(percentile(latency, 50) * 1000, 2),
            "first_item_ms_p99": round(percentile(latency, 99) * 1000, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.jobs", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--store", choices=("sqlite", "memory"), action="append")
    args = parser.parse_args(argv)
    for store in args.store or ["sqlite", "memory"]:
        print(json.dumps(measure(args.jobs, args.samples, store)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
