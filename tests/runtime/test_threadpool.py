"""The `def` handlers' thread pool: bounded, reuses idle threads, and never holds the process open."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from runtime.threadpool import DaemonThreadPool
from tests.support.servers import ROOT

# A process that runs a `def` handler which never returns, as the runaway tests do in the test
# session itself: with ThreadPoolExecutor's threads the interpreter waited for it at exit forever.
NEVER_RETURNS = """
import asyncio, time
from runtime.executor import Executor

def spin():
    while True:
        time.sleep(0.02)

async def main():
    executor = Executor(thread_pool_size=2)
    executor.run_sync(spin)
    await asyncio.sleep(0.1)
    executor.shutdown()
    print("main returned", flush=True)

asyncio.run(main())
"""


def test_a_handler_thread_that_never_returns_does_not_keep_the_process_alive():
    done = subprocess.run([sys.executable, "-c", NEVER_RETURNS], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "main returned\n"


def test_threads_are_bounded_reused_and_daemons():
    pool = DaemonThreadPool(2, thread_name_prefix="t")
    release = threading.Event()
    names: list[str] = []

    def work(i: int) -> int:
        names.append(threading.current_thread().name)
        assert threading.current_thread().daemon
        release.wait(5)
        return i

    futures = [pool.submit(work, i) for i in range(5)]
    time.sleep(0.1)
    assert len(names) == 2                      # two threads busy, three calls wait
    release.set()
    assert [f.result(5) for f in futures] == [0, 1, 2, 3, 4]
    assert set(names) <= {"t_0", "t_1"}          # the waiting calls ran on the same two threads
    assert pool.submit(lambda: 7).result(5) == 7 and len(pool._threads) == 2
    pool.shutdown()


def test_errors_reach_the_caller_and_shutdown_cancels_what_waits():
    pool = DaemonThreadPool(1, thread_name_prefix="t")
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    gate, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return gate.wait(5)

    running = pool.submit(hold)
    assert started.wait(5)
    waiting = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    gate.set()
    assert running.result(5) is True             # a call already running is left to finish
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
