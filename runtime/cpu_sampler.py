"""Which `def` handler threads burn CPU, sampled by a thread of its own.

Python threads busy on a CPU share one GIL with the event loop: with Python's 5 ms switch interval
and sixteen such threads, the loop waited ~100 ms for each turn and stalled for seconds. The sample
runs in its own thread because the loop is the one starved: a thread needs the GIL once per sample,
the loop needs it for every step of every request. Every TICK it reads each running handler
thread's CPU clock (ThreadGate.sample); while any burn, it shortens the GIL switch interval (only
then: shorter turns cost every thread hand-off, 13% of `def` JSON req/s at 0.2 ms) and their
function's next calls wait (ThreadGate.cpu_bound) until fewer burn.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import time

from .limits import ThreadGate
from .threadpool import call_threadsafe

__all__ = ("CpuSampler",)

TICK = 0.05  # seconds between samples


class CpuSampler:
    """Samples the watched gates' threads every TICK while any gate is watched; `stop` ends it."""

    def __init__(self, burning_switch_interval: float) -> None:
        self._burning_interval = burning_switch_interval
        self._gates: list[tuple[ThreadGate, asyncio.AbstractEventLoop]] = []
        self._saved_interval: float | None = None  # Python's own, while the shorter one is set
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, gate: ThreadGate, loop: asyncio.AbstractEventLoop) -> None:
        self._gates.append((gate, loop))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fnstream-cpu-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._restore()

    def _run(self) -> None:
        wall, cpu = time.monotonic(), time.process_time()
        while not self._stopped.wait(TICK):
            now_wall, now_cpu = time.monotonic(), time.process_time()
            burning = False
            for gate, loop in list(self._gates):
                if gate.running or gate.burning:
                    freed = gate.sample(now_wall - wall, now_cpu - cpu)
                    if freed > 0:
                        call_threadsafe(loop, gate.wake, freed)
                    burning = burning or bool(gate.burning)
            wall, cpu = now_wall, now_cpu
            if burning and self._saved_interval is None:
                self._saved_interval = sys.getswitchinterval()
                sys.setswitchinterval(self._burning_interval)
            elif not burning:
                self._restore()

    def _restore(self) -> None:
        saved, self._saved_interval = self._saved_interval, None
        if saved is not None:
            sys.setswitchinterval(saved)
