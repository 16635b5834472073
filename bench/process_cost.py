"""Instructions per stream event and per JSON invoke, server and worker processes apart:
`python -m bench.process_cost` (callgrind; figures that hold on a busy machine).

bench.cpu counts the server process only; a process-executor function also spends CPU in its
worker processes, on the same core in the bench (the server's tree is pinned to one). This runs
the fnstream bench server under `valgrind --tool=callgrind --trace-children=yes` (collection off),
warms up, then for each measurement zeroes and turns on collection in the server and every worker,
runs a fixed load, and reads each process's instruction total. Per event (one stream of `--events`;
100 concurrent streams of 100 events) and per request (`--requests` JSON invokes at
`--concurrency`), for the thread and process targets.
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from .client import Target, run_invokes, run_streams
from .servers import TARGETS, ServerProc, cpu_plan, pin_self, start_target

__all__ = ("main",)

EVENT = {"prompt": "hello", "n": 1, "tags": ["a", "b"]}  # the invoke scenario's body (bench/scenarios.py)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(c) for c in text)
    return out


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def _workers_quiet(server_pid: int) -> None:
    """Wait until no worker process is still starting (importing under valgrind takes long)."""
    for _ in range(120):
        before = {p: _cpu_ticks(p) for p in _children(server_pid)}
        await asyncio.sleep(1)
        if all(_cpu_ticks(p) - t <= 2 for p, t in before.items() if Path(f"/proc/{p}").exists()):
            return


def _control(pids: list[int], *args: str) -> None:
    for pid in pids:
        subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _total(out_dir: Path, pid: int) -> int:
    dumps = sorted(out_dir.glob(f"cg.{pid}.*"), key=lambda f: int(f.suffix[1:]))
    for line in dumps[-1].read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    return 0


async def _counted(server: ServerProc, out_dir: Path, load) -> tuple[int, int, int]:
    """(server instructions, workers' instructions, units of work) of one run of `load`."""
    server_pid = server.proc.pid
    workers = [p for p in _children(server_pid) if list(out_dir.glob(f"cg.{p}"))]
    pids = [server_pid, *workers]
    _control(pids, "-z")
    _control(pids, "-i", "on")
    units = await load()
    _control(pids, "-i", "off")
    _control(pids, "-d")
    return _total(out_dir, server_pid), sum(_total(out_dir, p) for p in workers), units


async def run(args: argparse.Namespace) -> int:
    server_cores, client_cores = cpu_plan()
    pin_self(client_cores)
    out_dir = Path(tempfile.mkdtemp(prefix="bench-process-cost-"))
    wrapper = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--instr-atstart=no",
               f"--callgrind-out-file={out_dir}/cg.%p"]
    server = start_target("fnstream", out_dir, server_cores, wrapper=wrapper)
    rows = []
    try:
        targets = [Target(name, "127.0.0.1", server.port, *TARGETS[name][1:]) for name in args.targets]
        for target in targets:  # warm up all first: no worker is still starting while another is measured
            await run_streams(target, {"count": 200}, 2)
            await run_invokes(target, EVENT, args.concurrency, 600, requests=200)
        await _workers_quiet(server.proc.pid)
        for target in targets:
            name = target.name

            async def stream(target: Target = target) -> int:
                (result,) = await run_streams(target, {"count": args.events}, 1)
                return result.events - 1

            async def streams(target: Target = target) -> int:
                results = await run_streams(target, {"count": 100}, 100)
                return sum(r.events - 1 for r in results)

            async def invokes(target: Target = target) -> int:
                return (await run_invokes(target, EVENT, args.concurrency, 600, requests=args.requests)).requests

            for what, load in (("stream event", stream), ("event of 100 streams × 100", streams),
                               ("JSON invoke", invokes)):
                srv, wrk, units = await _counted(server, out_dir, load)
                rows.append((name, what, srv / units, wrk / units))
                print(f"{name} {what}: server {srv / units:,.0f}  workers {wrk / units:,.0f} "
                      f"instructions per unit ({units} units)", flush=True)
    finally:
        server.stop()
    print(f"\ninstructions per unit (callgrind, user space); profiles in {out_dir}:")
    print("| target | unit | server | workers | total |")
    print("|---|---|---|---|---|")
    for name, what, srv, wrk in rows:
        print(f"| {name} | {what} | {srv:,.0f} | {wrk:,.0f} | {srv + wrk:,.0f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.process_cost", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=20_000, help="events of the measured stream")
    p.add_argument("--requests", type=int, default=2_000, help="JSON invokes measured")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--targets", nargs="*", default=["fnstream-thread", "fnstream-process"])
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
