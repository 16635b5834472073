"""ThreadGate's CPU sample on real threads: threads spinning in Python burn CPU, sleeping ones do not;
once `cpu_bound` of a function's threads burn, its next calls wait; a thread is stopped only while it
runs the invocation it was stopped for (runtime/thread_stop.py)."""
from __future__ import annotations

import threading
import time

from runtime.limits import ThreadGate
from runtime.thread_stop import InvocationStopped, run_stoppable, stop_thread


def _run_in_gate(gate: ThreadGate, fn, stop: threading.Event) -> threading.Thread:
    def body():
        ident = gate.enter()
        try:
            fn(stop)
        finally:
            gate.leave(ident)
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def _sleep(stop: threading.Event) -> None:
    stop.wait()


def _sample(gate: ThreadGate, seconds: float = 0.3) -> int:
    wall, cpu = time.monotonic(), time.process_time()  # the threads' clocks started at gate.enter()
    time.sleep(seconds)
    return gate.sample(time.monotonic() - wall, time.process_time() - cpu)


def test_spinning_threads_burn_and_sleeping_ones_do_not():
    stop = threading.Event()
    spinning, sleeping = ThreadGate("spin", 8, cpu_bound=2), ThreadGate("sleep", 8, cpu_bound=2)
    threads = [_run_in_gate(spinning, _spin, stop) for _ in range(3)]
    threads += [_run_in_gate(sleeping, _sleep, stop) for _ in range(3)]
    try:
        time.sleep(0.05)
        _sample(spinning)
        _sample(sleeping)
        assert len(spinning.burning) == 3 and not sleeping.burning
        assert not spinning.try_acquire()   # two or more burn: the next call waits
        assert sleeping.try_acquire()       # threads waiting on I/O never limit anyone
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    _sample(spinning, 0.05)  # once they ended, the function takes calls again
    assert not spinning.burning and spinning.try_acquire()


def test_a_stop_lands_only_in_the_invocation_it_was_meant_for():
    done: list[object] = []
    ready = threading.Event()

    def spin_until_stopped():
        ready.set()
        while True:
            pass

    def serve():
        try:
            run_stoppable("first", spin_until_stopped)
        except InvocationStopped:
            done.append("stopped")
        done.append(run_stoppable("second", lambda: sum(range(100_000))))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(5)
    assert not stop_thread(thread.ident, "second")  # not what it runs: nothing is raised
    assert stop_thread(thread.ident, "first")
    thread.join(5)
    assert done == ["stopped", sum(range(100_000))]
    assert not stop_thread(thread.ident, "first")   # over: a late stop finds nothing to stop
