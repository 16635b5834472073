"""CPU-bound handlers: two concurrent invocations vs two sequential ones, thread vs process executor.

A figure, not a test: on a machine with >= 2 cores the process executor's ratio
(concurrent / sequential) should approach 0.5; the thread executor's stays near 1.0 (the GIL).
Run: `.venv/bin/python -m bench.process_parallel [--loops N]`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from runtime.executor import Executor
from runtime.invocation import Invocation
from runtime.manifest import parse_manifest
from runtime.registry import Registry

__all__ = ("main",)

CODE = '''
def burn(event, context):
    total = 0
    for i in range(int(event["loops"])):
        total += i * i
    return total
'''


async def measure(loops: int) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "burn.py").write_text(CODE)
        registry = Registry([Path(tmp)])
        registry.deploy(parse_manifest(
            "- {name: cpu-thread, handler: burn.burn, executor: thread}\n"
            "- {name: cpu-process, handler: burn.burn, executor: process, instances: 2}\n", "bench", Path(tmp)))
        executor = Executor(4)
        loop = asyncio.get_running_loop()

        async def call(name: str) -> None:
            await executor.start(Invocation(registry.get(name), {"loops": loops}, mode="json", loop=loop))

        out = {}
        try:
            for name in ("cpu-thread", "cpu-process"):
                await asyncio.gather(call(name), call(name))  # warm up: workers started, code loaded
                t0 = time.perf_counter()
                await call(name)
                await call(name)
                sequential = time.perf_counter() - t0
                t0 = time.perf_counter()
                await asyncio.gather(call(name), call(name))
                out[name] = (sequential, time.perf_counter() - t0)
        finally:
            await registry.stop_workers()
            executor.shutdown()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=5_000_000)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, {args.loops} loop iterations per invocation")
    for name, (seq, conc) in asyncio.run(measure(args.loops)).items():
        print(f"{name:12s} 2 sequential {seq:6.2f} s   2 concurrent {conc:6.2f} s   ratio {conc / seq:4.2f}")


if __name__ == "__main__":
    main()
