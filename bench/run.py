"""Run every benchmark: `python -m bench.run` (add `--latest` to refresh bench/latest/).

Each target runs as its own process pinned to one core, the client (this process) to another.
Scenarios run round by round, target after target, so slow drift of the machine hits all alike;
the best round of each is kept. Prints one JSON line per measurement and writes the JSON lines,
a markdown table and a PNG chart under bench/results/<timestamp>/.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import sys
import time
from pathlib import Path

from .client import run_invokes, run_streams
from .report import draw_chart, markdown_table
from .scenarios import SCENARIOS, measure
from .servers import BENCH, OPTIONAL_TARGETS, TARGETS, cpu_plan, make_target, pin_self, start_target

__all__ = ("main",)


def _better(scenario, a: dict | None, b: dict) -> bool:
    if a is None or a.get("errors"):
        return True
    return b["value"] > a["value"] if scenario.higher_is_better else b["value"] < a["value"]


async def _warm_up(targets) -> None:
    for t in targets:
        await run_streams(t, {"count": 100}, 10)
        await run_invokes(t, {"warm": True}, 8, 0.3)


async def run(args) -> int:
    out_dir = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    server_cores, client_cores = cpu_plan()
    pin_self(client_cores)
    names = [t for t in TARGETS if (t in args.targets if args.targets else t not in OPTIONAL_TARGETS)]
    kinds = sorted({TARGETS[n][0] for n in names})
    servers = {}
    try:
        for kind in kinds:
            servers[kind] = start_target(kind, out_dir, server_cores)
        targets = {n: make_target(n, servers[TARGETS[n][0]]) for n in names}
        await _warm_up(targets.values())
        scenarios = [s for s in SCENARIOS if not args.scenarios or s.key in args.scenarios]
        best: dict[str, dict] = {n: {} for n in names}
        lines = open(out_dir / "results.jsonl", "w")  # noqa: SIM115 (closed after the rounds)
        for rnd in range(args.rounds):
            for sc in scenarios:
                if not sc.rounds and rnd > 0:
                    continue
                for name in names:
                    if name not in sc.targets:
                        continue
                    res = await measure(sc, targets[name], servers[TARGETS[name][0]], args.scale)
                    rec = {"scenario": sc.key, "target": name, "round": rnd, "unit": sc.unit, **res}
                    line = json.dumps(rec, default=lambda v: round(v, 3))
                    print(line, flush=True)
                    lines.write(line + "\n")
                    if _better(sc, best[name].get(sc.key), res):
                        best[name][sc.key] = res
        lines.close()
    finally:
        for s in servers.values():
            s.stop()
    meta = {"note": f"aiohttp = bare aiohttp on uvloop, listen backlog 2048 (the ceiling); "
                    f"{args.rounds} rounds, best kept; server on cores {sorted(server_cores or [])}, "
                    f"client on {sorted(client_cores or [])}; Python {platform.python_version()}."}
    table = markdown_table(scenarios, names, best, meta)
    (out_dir / "table.md").write_text(table)
    (out_dir / "best.json").write_text(json.dumps(best, indent=1, default=lambda v: round(v, 3)))
    charted = draw_chart(scenarios, names, best, out_dir / "chart.png")
    print(table)
    print(f"results in {out_dir}" + ("" if charted else " (no chart: matplotlib missing)"))
    if args.latest:
        latest = BENCH / "latest"
        latest.mkdir(exist_ok=True)
        for f in ("table.md", "chart.png", "best.json"):
            if (out_dir / f).exists():
                shutil.copy(out_dir / f, latest / f)
    busy = [f"{n}/{k}" for n in names for k, r in best[n].items() if r.get("client_cpu", 0) > 0.9]
    if busy:
        print("warning: the client was over 90% CPU in: " + ", ".join(busy), file=sys.stderr)
    return 1 if any(r.get("errors") for n in names for r in best[n].values()) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0, help="multiply event counts and durations (e.g. 0.1)")
    p.add_argument("--targets", nargs="*", help=f"subset of {list(TARGETS)}")
    p.add_argument("--scenarios", nargs="*", help=f"subset of {[s.key for s in SCENARIOS]}")
    p.add_argument("--out", default=str(BENCH / "results"))
    p.add_argument("--latest", action="store_true", help="also copy table, chart and figures to bench/latest/")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
