"""Where an idle open stream's memory goes, by allocation site: `python -m bench.memory`.

`bench.run` measures RSS per idle stream; this says which lines of code hold it. The ceiling
(bare aiohttp on uvloop) and fnstream (`bench-stream`, `async def`) each run as their own process
under `tracemalloc`; each gets a warm-up, then a heap snapshot, then `--streams` SSE responses
that got one event and idle (the handler sleeps), then a second snapshot. The difference per stream is
grouped by the line that allocated it and printed beside the ceiling's figure for the same line,
largest gap first: the lines only fnstream has are what a design must remove to close the gap.
`--baseline TREE` measures another checkout's fnstream too (`base-async`), for a before/after in one run.
(The Python heap only: RSS adds the kernel's socket buffers and the allocator's slack.)
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import linecache
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from .client import Target, hold_streams
from .servers import ROOT, ServerProc, cpu_plan, make_target, pin_self, start_target

__all__ = ("main", "allocation_sites")

_TRACED = [sys.executable, "-m", "bench.memory", "--traced"]
_DUMP = "FNSTREAM_BENCH_SNAPSHOT"  # where the traced server dumps its snapshots (a path prefix)


def _run_traced(argv: list[str]) -> int:
    """Run `argv` (`python -m MODULE ...`) in this process under tracemalloc; each SIGUSR1 dumps a
    snapshot to `$FNSTREAM_BENCH_SNAPSHOT.N`."""
    import runpy

    tracemalloc.start()
    dumps = iter(range(1_000_000))

    def dump(_signum: int, _frame: object) -> None:
        path = f"{os.environ[_DUMP]}.{next(dumps)}"
        gc.collect()  # garbage in cycles (closed streams' tasks) freed now, not between the snapshots
        tracemalloc.take_snapshot().dump(path + ".tmp")
        os.replace(path + ".tmp", path)  # whole, or not there yet

    signal.signal(signal.SIGUSR1, dump)
    _python, flag, module, *rest = argv
    if flag != "-m":
        raise SystemExit(f"--traced runs `python -m MODULE ...`, not {argv}")
    sys.argv = [module, *rest]
    sys.path.insert(0, os.getcwd())
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def _site(frame: tracemalloc.Frame) -> str:
    """`file:line  code`, the file relative to this checkout, site-packages or the standard library."""
    name = frame.filename
    for prefix in (f"{ROOT}/", "site-packages/", f"python{sys.version_info.major}.{sys.version_info.minor}/"):
        name = name.split(prefix)[-1]
    code = linecache.getline(frame.filename, frame.lineno).strip()
    return f"{name}:{frame.lineno}  {code[:70]}"


def allocation_sites(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, streams: int) -> dict[str, float]:
    """Bytes per stream allocated (and still held) by each line, between two snapshots."""
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "lineno")
    return {_site(s.traceback[0]): s.size_diff / streams for s in stats if s.size_diff}


async def _snapshot(server: ServerProc, prefix: str, n: int) -> tracemalloc.Snapshot:
    server.proc.send_signal(signal.SIGUSR1)
    path = Path(f"{prefix}.{n}")
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.kind} wrote no snapshot; see {server.log_path}")
        await asyncio.sleep(0.1)
    return tracemalloc.Snapshot.load(str(path))


async def _measure(name: str, streams: int, log_dir: Path, tree: Path = ROOT) -> dict[str, float]:
    server_cores, client_cores = cpu_plan()
    pin_self(client_cores)
    prefix = str(log_dir / f"{name}.snapshot")
    os.environ[_DUMP] = prefix
    kind = {"aiohttp": "aiohttp", "fnstream-async": "fnstream", "base-async": "fnstream"}[name]
    server = start_target(kind, log_dir, server_cores, tree, label=name, wrapper=_TRACED)
    try:
        target: Target = make_target(name.replace("base-", "fnstream-"), server)
        for t in await hold_streams(target, {"count": 1, "hold_s": 300}, 50):  # warm-up: first-use allocations
            t.close()
        await asyncio.sleep(1.0)
        before = await _snapshot(server, prefix, 0)
        held = await hold_streams(target, {"count": 1, "hold_s": 300}, streams)
        await asyncio.sleep(1.0)
        after = await _snapshot(server, prefix, 1)
        for t in held:
            t.close()
        return allocation_sites(before, after, streams)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=500)
    p.add_argument("--top", type=int, default=40, help="lines to show, largest gap first")
    p.add_argument("--baseline", help="another checkout whose fnstream is measured too (base-async)")
    p.add_argument("--traced", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # internal: run a server traced
    args = p.parse_args(argv)
    if args.traced is not None:
        return _run_traced(args.traced)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        ceiling = asyncio.run(_measure("aiohttp", args.streams, Path(tmp)))
        fnstream = asyncio.run(_measure("fnstream-async", args.streams, Path(tmp)))
        base = asyncio.run(_measure("base-async", args.streams, Path(tmp), Path(args.baseline))) \
            if args.baseline else None
    total_c, total_f = sum(ceiling.values()), sum(fnstream.values())
    print(f"\nPython heap per idle open stream ({args.streams} held, tracemalloc): ceiling {total_c / 1024:.2f} KB, "
          f"fnstream {total_f / 1024:.2f} KB ({total_f / total_c:.2f}×)")
    if base is not None:
        total_b = sum(base.values())
        print(f"baseline ({args.baseline}) {total_b / 1024:.2f} KB ({total_b / total_c:.2f}×); "
              f"fnstream - baseline: {(total_f - total_b):+.0f} B per stream")
    print("| allocated at | fnstream B/stream | ceiling B/stream | gap |")
    print("|---|---|---|---|")
    sites = sorted(set(ceiling) | set(fnstream), key=lambda s: -(fnstream.get(s, 0.0) - ceiling.get(s, 0.0)))
    for site in sites[:args.top]:
        f, c = fnstream.get(site, 0.0), ceiling.get(site, 0.0)
        where, _, code = site.partition("  ")
        print(f"| `{where}` `{code.replace('|', '/')}` | {f:.0f} | {c:.0f} | {f - c:+.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
