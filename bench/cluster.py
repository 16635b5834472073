"""Cluster mode throughput: the embedded server against a frontend plus 1 and 2 `fnstream worker`s over Redis.

A figure, not a test. Each setup runs on a private redis-server (no persistence) and real
processes; the client is this process. Measures JSON invocations/s of `echo` (concurrency 32)
and SSE events/s of one `ticker` stream (delay 0) and of 8 at once.
Run: `.venv/bin/python -m bench.cluster [--invocations N] [--events N]`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

__all__ = ("main",)

ROOT = Path(__file__).resolve().parent.parent
QUIET = {**os.environ, "FNSTREAM_LOG": "WARNING"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "frontend.cli", *args], cwd=ROOT, env=QUIET,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_http(url: str) -> None:
    for _ in range(300):
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


async def _wait_workers(base: str, n: int) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            async with s.get(base + "/cluster/v1/status") as r:
                if sum("echo" in w["functions"] for w in (await r.json())["workers"]) >= n:
                    return
            await asyncio.sleep(0.05)
    raise RuntimeError("workers did not register")


async def _invocations(base: str, n: int, concurrency: int = 32) -> float:
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as s:
        async def one(i: int) -> None:
            async with sem:
                async with s.post(base + "/serverless/v1/functions/echo/invocations", json={"i": i}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - start)


async def _events(base: str, count: int, streams: int) -> float:
    async with aiohttp.ClientSession() as s:
        async def one() -> int:
            seen = 0
            async with s.post(base + "/serverless/v1/functions/ticker/invocations",
                              json={"count": count, "delay_ms": 0},
                              headers={"Accept": "text/event-stream"}) as r:
                async for line in r.content:
                    seen += line.startswith(b"data:")
            return seen
        start = time.perf_counter()
        seen = sum(await asyncio.gather(*(one() for _ in range(streams))))
        return seen / (time.perf_counter() - start)


async def _measure(base: str, invocations: int, events: int) -> dict[str, float]:
    await _invocations(base, 100)          # warm-up
    return {"invocations/s": await _invocations(base, invocations),
            "events/s (1 stream)": await _events(base, events, 1),
            "events/s (8 streams)": await _events(base, events // 4, 8)}


def run_setup(workers: int | None, invocations: int, events: int) -> dict[str, float]:
    procs: list[subprocess.Popen] = []
    port = _port()
    base = f"http://127.0.0.1:{port}"
    try:
        if workers is None:
            procs.append(_spawn("serve", "--port", str(port)))
            _wait_http(base + "/healthz")
        else:
            rport = _port()
            redis_server = shutil.which("redis-server") or "/usr/bin/redis-server"
            procs.append(subprocess.Popen([redis_server, "--port", str(rport),
                                           "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL))
            url = f"redis://127.0.0.1:{rport}/0"
            time.sleep(0.2)
            procs.append(_spawn("serve", "--port", str(port), "--cluster", url, "-s", "cluster.role=frontend"))
            procs.extend(_spawn("worker", "--cluster", url) for _ in range(workers))
            _wait_http(base + "/healthz")
            asyncio.run(_wait_workers(base, workers))
        return asyncio.run(_measure(base, invocations, events))
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invocations", type=int, default=2000)
    parser.add_argument("--events", type=int, default=20000)
    args = parser.parse_args(argv)
    rows = {}
    for label, workers in (("embedded", None), ("redis, 1 worker", 1), ("redis, 2 workers", 2)):
        rows[label] = run_setup(workers, args.invocations, args.events)
        print(label, {k: round(v) for k, v in rows[label].items()}, flush=True)
    keys = list(next(iter(rows.values())))
    print("\n| setup | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for label, row in rows.items():
        print(f"| {label} | " + " | ".join(f"{row[k]:,.0f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
