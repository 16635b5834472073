"""Cluster mode against the embedded server: throughput, and what each item costs in CPU and Redis.

A figure, not a test. Each setup runs on a private redis-server (no persistence) and real
processes; the client is this process. Scenarios: JSON invocations of `echo` (concurrency 32,
p50/p99), SSE events of one `ticker` stream (delay 0) and of 8 at once. Besides items/s (noisy on
a shared machine) every scenario reports the CPU time its server processes spent per item —
frontend + workers + redis-server, from /proc, summed — and Redis commands per item (`INFO
commandstats` before and after, commands run inside Lua scripts included): both hold under load.

`--scaling` adds the scale-out figure: a CPU-bound `def` handler (bench_handlers.burn, concurrency 4:
the jobs each worker keeps in flight) through 1 worker, then 2, each worker pinned to its own core
with taskset semantics (sched_setaffinity), frontend, redis-server and the load (this process) on
core 0 with the second worker. It reports jobs/s and each process's CPU per job, and the
throughput the CPU figures give when every worker and the frontend + Redis each have a core of
their own (what this 2-core box cannot show directly).
Setups run in turn `--rounds` times. The table shows, per setup, the round with the least CPU per
item (the one least disturbed by other load) and, for items/s, the median over rounds of the
ratio to embedded measured in the same round. Round trips per item are Redis's
read events (`INFO stats` total_reads_processed): one per client round trip, whatever it carried.
Run: `.venv/bin/python -m bench.cluster [--rounds N] [--invocations N] [--events N] [--scaling] [--setups ...]`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import redis

__all__ = ("main",)

ROOT = Path(__file__).resolve().parent.parent
QUIET = {**os.environ, "FNSTREAM_LOG": "WARNING"}
_TICK = os.sysconf("SC_CLK_TCK")
ROUND_TRIPS = "(round trips)"
CODE_ROOTS = f"runtime.codeRoots=[{ROOT / 'functions'},{ROOT / 'bench' / 'functions'}]"
BURN: dict[str, Any] = {"name": "bench-burn", "handler": "bench_handlers.burn",
                        "codePath": str(ROOT / "bench" / "functions"), "timeout": 120, "concurrency": 4}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK   # utime + stime of every thread


def _pinned(cores: set[int] | None) -> Any:
    return (lambda: os.sched_setaffinity(0, cores)) if cores else None


class Setup:
    """The processes of one setup: embedded (one server) or frontend + N workers + redis-server."""

    def __init__(self, workers: int | None, *, worker_cores: Sequence[set[int] | None] | None = None,
                 server_cores: set[int] | None = None) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.redis: redis.Redis | None = None
        self._probes = 0   # this bench's own INFO reads, left out of the round trips
        port = _port()
        self.base = f"http://127.0.0.1:{port}"
        try:
            if workers is None:
                self._spawn("embedded", server_cores, "serve", "--port", str(port), "-s", CODE_ROOTS)
                _wait_http(self.base + "/healthz")
                return
            rport = _port()
            redis_server = shutil.which("redis-server") or "/usr/bin/redis-server"
            self.procs["redis"] = subprocess.Popen([redis_server, "--port", str(rport), "--save", "",
                                                    "--appendonly", "no"], stdout=subprocess.DEVNULL,
                                                   preexec_fn=_pinned(server_cores))
            self.redis = redis.Redis(port=rport)
            for _ in range(200):
                try:
                    self.redis.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.02)
            url = f"redis://127.0.0.1:{rport}/0"
            self._spawn("frontend", server_cores, "serve", "--port", str(port), "--cluster", url,
                        "-s", "cluster.role=frontend", "-s", CODE_ROOTS)
            for i in range(workers):
                cores = worker_cores[i] if worker_cores else None
                self._spawn(f"worker{i + 1}", cores, "worker", "--cluster", url, "-s", CODE_ROOTS)
            _wait_http(self.base + "/healthz")
            asyncio.run(_wait_workers(self.base, "echo", workers))
        except BaseException:
            self.stop()
            raise

    def _spawn(self, role: str, cores: set[int] | None, *args: str) -> None:
        self.procs[role] = subprocess.Popen([sys.executable, "-m", "frontend.cli", *args], cwd=ROOT, env=QUIET,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            preexec_fn=_pinned(cores))

    def cpu(self) -> dict[str, float]:
        return {role: _cpu(p.pid) for role, p in self.procs.items()}

    def commands(self) -> dict[str, int]:
        if self.redis is None:
            return {}
        stats: dict[str, Any] = self.redis.info("commandstats")
        out = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"}
        # Read events Redis served: one per client round trip, however many commands it carried.
        out[ROUND_TRIPS] = int(self.redis.info("stats")["total_reads_processed"]) - 2 * self._probes
        self._probes += 1
        return out

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.terminate()
            p.wait(10)


def _wait_http(url: str) -> None:
    for _ in range(300):
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


async def _wait_workers(base: str, function: str, n: int) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            async with s.get(base + "/cluster/v1/status") as r:
                if sum(function in w["functions"] for w in (await r.json())["workers"]) >= n:
                    return
            await asyncio.sleep(0.05)
    raise RuntimeError("workers did not register")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _invocations(base: str, n: int, function: str = "echo", event: Any = None,
                       concurrency: int = 32) -> tuple[int, list[float]]:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        async def one(i: int) -> None:
            async with sem:
                t0 = time.perf_counter()
                async with s.post(f"{base}/serverless/v1/functions/{function}/invocations",
                                  json={"i": i} if event is None else event) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                latencies.append(time.perf_counter() - t0)
        await asyncio.gather(*(one(i) for i in range(n)))
    return n, latencies


async def _events(base: str, count: int, streams: int) -> tuple[int, list[float]]:
    async with aiohttp.ClientSession() as s:
        async def one() -> int:
            seen = 0
            async with s.post(base + "/serverless/v1/functions/ticker/invocations",
                              json={"count": count, "delay_ms": 0},
                              headers={"Accept": "text/event-stream"}) as r:
                async for line in r.content:
                    seen += line.startswith(b"data:")
            return seen
        return sum(await asyncio.gather(*(one() for _ in range(streams)))), []


def measure(setup: Setup, name: str, run: Any) -> dict[str, Any]:
    """Run one scenario; items/s, and per item: server CPU (µs, by process) and Redis commands."""
    cpu0, cmd0, t0 = setup.cpu(), setup.commands(), time.perf_counter()
    items, latencies = asyncio.run(run)
    wall = time.perf_counter() - t0
    cpu1, cmd1 = setup.cpu(), setup.commands()
    by_role = {role: (cpu1[role] - cpu0[role]) * 1e6 / items for role in cpu1}
    cmds = {k: (v - cmd0.get(k, 0)) / items for k, v in cmd1.items() if v - cmd0.get(k, 0)}
    trips = cmds.pop(ROUND_TRIPS, 0.0)
    out: dict[str, Any] = {"scenario": name, "items": items, "per_s": items / wall,
                           "cpu_us": sum(by_role.values()), "cpu_us_by": by_role,
                           "redis_cmds": sum(cmds.values()), "redis_cmds_by": cmds, "round_trips": trips}
    if latencies:
        out["p50_ms"], out["p99_ms"] = _pct(latencies, 0.5) * 1000, _pct(latencies, 0.99) * 1000
    return out


def run_setup(workers: int | None, invocations: int, events: int) -> list[dict[str, Any]]:
    setup = Setup(workers)
    try:
        asyncio.run(_invocations(setup.base, 200))          # warm-up
        return [measure(setup, "json", _invocations(setup.base, invocations)),
                measure(setup, "sse1", _events(setup.base, events, 1)),
                measure(setup, "sse8", _events(setup.base, events // 4, 8))]
    finally:
        setup.stop()


async def _deploy_burn(base: str, workers: int) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(base + "/admin/v1/functions", json=BURN) as r:
            assert r.status in (200, 201), await r.text()
    await _wait_workers(base, BURN["name"], workers)


def run_scaling(jobs: int, loops: int) -> list[dict[str, Any]]:
    """The CPU-bound handler through 1 worker (core 1) and 2 workers (cores 1 and 0)."""
    cores = sorted(os.sched_getaffinity(0))
    first, second = {cores[-1]}, {cores[0]}
    rows = []
    os.sched_setaffinity(0, second)   # the load too: worker 1's core is its own in both setups
    for n in (1, 2):
        setup = Setup(n, worker_cores=[first, second][:n], server_cores=second)
        try:
            asyncio.run(_deploy_burn(setup.base, n))
            event = {"loops": loops}
            asyncio.run(_invocations(setup.base, 4 * n, BURN["name"], event, concurrency=4 * n))   # warm-up
            row = measure(setup, f"burn, {n} worker(s)",
                          _invocations(setup.base, jobs, BURN["name"], event, concurrency=4 * n))
            rows.append(row)
        finally:
            setup.stop()
    os.sched_setaffinity(0, set(cores))
    return rows


def _projection(row: dict[str, Any], workers: int) -> float:
    """Jobs/s with each worker, and the frontend + Redis, on a core of its own: the busiest core bounds it."""
    by: dict[str, float] = row["cpu_us_by"]
    worker = sum(v for k, v in by.items() if k.startswith("worker"))
    return 1e6 / max(worker / workers, by.get("frontend", 0.0), by.get("redis", 0.0))


def _fmt(row: dict[str, Any]) -> str:
    text = f"{row['per_s']:,.0f}/s, {row['cpu_us']:.0f} µs CPU/item"
    if "p99_ms" in row:
        text += f", p50 {row['p50_ms']:.1f} / p99 {row['p99_ms']:.1f} ms"
    if row["redis_cmds"]:
        text += f", {row['redis_cmds']:.2f} Redis cmds/item in {row['round_trips']:.2f} round trips"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invocations", type=int, default=3000)
    parser.add_argument("--events", type=int, default=40000)
    parser.add_argument("--setups", nargs="*", default=["embedded", "1", "2"],
                        help="embedded and/or worker counts")
    parser.add_argument("--scaling", action="store_true", help="also the CPU-bound 1 vs 2 workers figure")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--loops", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3, help="setups run in turn this often; the best kept")
    parser.add_argument("--json", action="store_true", help="print every row as JSON too")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    rates: dict[tuple[str, str], list[float]] = {}   # (setup, scenario) -> items/s of every round
    for _ in range(args.rounds):
        for label in args.setups:
            workers = None if label == "embedded" else int(label)
            name = "embedded" if workers is None else f"redis, {workers} worker{'s' * (workers > 1)}"
            for row in run_setup(workers, args.invocations, args.events):
                print(name, row["scenario"], _fmt(row), flush=True)
                if args.json:
                    print(json.dumps(row), flush=True)
                rates.setdefault((name, row["scenario"]), []).append(row["per_s"])
                kept = results.setdefault(name, {})
                # Best round by CPU per item: the one least disturbed by the machine's other load.
                if row["scenario"] not in kept or row["cpu_us"] < kept[row["scenario"]]["cpu_us"]:
                    kept[row["scenario"]] = row
    base = results.get("embedded")
    titles = {"json": "JSON invocations", "sse1": "SSE events (1 stream)", "sse8": "SSE events (8 streams)"}
    print("\n| setup | " + " | ".join(titles.values()) + " |\n|---|" + "---|" * len(titles))
    for name, rows in results.items():
        cells = []
        for key in titles:
            row = rows[key]
            cell = f"{row['per_s']:,.0f}/s"
            if base and name != "embedded":
                # items/s: the median over rounds of the ratio to embedded in the same round
                ratios = [a / b for a, b in zip(rates[name, key], rates["embedded", key], strict=True)]
                cell += f" (median {statistics.median(ratios):.2f}×)"
            cell += f"<br>{row['cpu_us']:.0f} µs CPU"
            if base and name != "embedded":
                cell += f" ({base[key]['cpu_us'] / row['cpu_us']:.2f}×)"
            if "p99_ms" in row:
                cell += f"<br>p50 {row['p50_ms']:.1f} / p99 {row['p99_ms']:.1f} ms"
            if row["redis_cmds"]:
                cell += f"<br>{row['redis_cmds']:.2f} Redis cmds, {row['round_trips']:.2f} round trips"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name, rows in results.items():
        for key, row in rows.items():
            if row["redis_cmds_by"]:
                top = sorted(row["redis_cmds_by"].items(), key=lambda kv: -kv[1])
                print(f"{name} {key} Redis commands/item:", ", ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.01))
            print(f"{name} {key} CPU µs/item by process:",
                  ", ".join(f"{k} {v:.0f}" for k, v in row["cpu_us_by"].items()))
    if args.scaling:
        burns = run_scaling(args.jobs, args.loops)
        for n, row in enumerate(burns, 1):
            print(f"burn, {n} worker(s): {_fmt(row)}; CPU µs/job by process:",
                  ", ".join(f"{k} {v:.0f}" for k, v in row["cpu_us_by"].items()),
                  f"; projected with a core each: {_projection(row, n):,.1f} jobs/s", flush=True)
        print(f"2 workers / 1 worker: measured {burns[1]['per_s'] / burns[0]['per_s']:.2f}×, "
              f"projected {_projection(burns[1], 2) / _projection(burns[0], 1):.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
