"""Server CPU time per JSON invoke: `python -m bench.cpu` (figures that hold on a busy machine).

Throughput is meaningless on a shared machine; the CPU time a server process spends per request
is not (its own utime + stime from /proc, every thread included, over a fixed number of requests
from a fixed load client). The ceiling (bare aiohttp on uvloop, backlog 2048) and fnstream run in
the same run, trial after trial in turn, and the median trial of each is kept; the ratio is the
ceiling's CPU per request over the target's (1.0 = as cheap as bare aiohttp; 0.8 = 25% more).
`--baseline TREE` adds the fnstream targets of another checkout (`base-async`, `base-thread`), for
a before/after in one run. p50/p99 latency are the client's, at the given concurrency.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .client import Target, percentile, run_invokes
from .servers import ROOT, TARGETS, ServerProc, cpu_plan, pin_self, start_target

__all__ = ("main", "measure_cpu", "measure_instructions")

EVENT = {"prompt": "hello", "n": 1, "tags": ["a", "b"]}  # the invoke scenario's body (bench/scenarios.py)
CEILING = "aiohttp"


async def measure_cpu(target: Target, server: ServerProc, requests: int, concurrency: int) -> dict:
    """One trial: a short warm-up, then `requests` requests; the server's CPU µs per request."""
    await run_invokes(target, EVENT, concurrency, 60, requests=max(200, requests // 10))
    before = server.cpu_seconds()
    result = await run_invokes(target, EVENT, concurrency, 600, requests=requests)
    cpu = server.cpu_seconds() - before
    return {"us_per_request": cpu / result.requests * 1e6, "requests": result.requests, "errors": result.errors,
            "p50_ms": percentile(result.latencies, 50) * 1000, "p99_ms": percentile(result.latencies, 99) * 1000,
            "server_cpu": cpu / result.seconds}


async def measure_instructions(target: Target, server: ServerProc, requests: int, concurrency: int,
                               out: Path) -> dict:
    """One trial under callgrind: instructions (user space) per request, collected only while
    `requests` requests run (the server was started with collection off)."""
    await run_invokes(target, EVENT, concurrency, 600, requests=max(100, requests // 5))
    pid = str(server.proc.pid)
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)  # zero what is counted
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    result = await run_invokes(target, EVENT, concurrency, 600, requests=requests)
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    dumps = sorted(out.parent.glob(f"{out.name}.*"), key=lambda f: int(f.suffix[1:]))  # .1, .2, ...: the last
    total = 0
    for line in dumps[-1].read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            total = int(line.split()[1])
    return {"us_per_request": total / result.requests / 1000, "instructions": total, "requests": result.requests,
            "errors": result.errors, "p50_ms": percentile(result.latencies, 50) * 1000,
            "p99_ms": percentile(result.latencies, 99) * 1000, "profile": str(dumps[-1])}


async def run(args: argparse.Namespace) -> int:
    server_cores, client_cores = cpu_plan()
    pin_self(client_cores)
    names = args.targets
    log_dir = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    servers: dict[str, ServerProc] = {}
    targets: dict[str, Target] = {}
    try:
        for name in names:
            base = name.startswith("base-")
            kind, _stream, echo = TARGETS[name.replace("base-", "fnstream-") if base else name]
            label = f"base-{kind}" if base else kind
            if label not in servers:
                tree = Path(args.baseline) if base else ROOT
                wrapper = None
                if args.callgrind:
                    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                               f"--callgrind-out-file={log_dir / label}.callgrind"]
                servers[label] = start_target(kind, log_dir, server_cores, tree, label, wrapper)
            targets[name] = Target(name, "127.0.0.1", servers[label].port, None, echo)
        trials: dict[str, list[dict]] = {n: [] for n in names}
        for trial in range(args.trials):
            for name in names[trial % len(names):] + names[:trial % len(names)]:  # rotate who goes first
                label = next(k for k, s in servers.items() if s.port == targets[name].port)
                if args.callgrind:
                    res = await measure_instructions(targets[name], servers[label], args.requests,
                                                     args.concurrency, log_dir / f"{label}.callgrind")
                else:
                    res = await measure_cpu(targets[name], servers[label], args.requests, args.concurrency)
                trials[name].append(res)
                print(json.dumps({"target": name, "trial": trial, **res}, default=lambda v: round(v, 2)), flush=True)
    finally:
        for s in servers.values():
            s.stop()
    summary = {}
    for name, rows in trials.items():
        us = statistics.median(r["us_per_request"] for r in rows)
        summary[name] = {"us_per_request": us, "p50_ms": statistics.median(r["p50_ms"] for r in rows),
                         "p99_ms": statistics.median(r["p99_ms"] for r in rows),
                         "errors": sum(r["errors"] for r in rows)}
    ceiling = summary.get(CEILING)
    cost = "k instructions (callgrind)" if args.callgrind else "CPU µs"
    print(f"\nserver {cost} per JSON invoke, median of {args.trials} trials of {args.requests} requests at "
          f"concurrency {args.concurrency} (server on cores {sorted(server_cores or [])}, client on "
          f"{sorted(client_cores or [])}); logs and profiles in {log_dir}:")
    print(f"| target | {cost}/request | ratio to ceiling | p50 ms | p99 ms | p99 / ceiling's |")
    print("|---|---|---|---|---|---|")
    for name, s in summary.items():
        ratio = f"{ceiling['us_per_request'] / s['us_per_request']:.2f}×" if ceiling else "—"
        p99 = f"{s['p99_ms'] / ceiling['p99_ms']:.2f}×" if ceiling else "—"
        print(f"| {name} | {s['us_per_request']:.1f} | {ratio} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {p99} |")
    return 1 if any(s["errors"] for s in summary.values()) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=20_000, help="requests per trial")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--targets", nargs="*", default=[CEILING, "fnstream-async", "fnstream-thread"],
                   help="aiohttp, fnstream-async, fnstream-thread, base-async, base-thread, ...")
    p.add_argument("--baseline", help="another checkout whose fnstream the base-* targets run")
    p.add_argument("--callgrind", action="store_true",
                   help="count instructions under valgrind instead (repeatable on a busy machine; ~50x slower: "
                        "use --requests 2000)")
    args = p.parse_args(argv)
    if any(n.startswith("base-") for n in args.targets) and not args.baseline:
        p.error("base-* targets need --baseline TREE")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
