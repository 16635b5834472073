"""The per-function pool of worker processes: start, scale, replace, stop.

Each worker is a fresh interpreter (`python -m runtime.process.worker`), never a fork of the
event-loop process, and runs up to `slots` invocations at once (manifest `instanceConcurrency`).
The frontend reads each worker from a dedicated thread (runtime/process/worker_process.py), so a
pool can be started by a synchronous deploy before any event loop runs, and a dead worker is
noticed (EOF on its socket) at once.

Scaling: the pool keeps `minInstances` workers, starts one more (up to `maxInstances`) whenever an
invocation waits for a free slot, and a supervisor thread stops workers idle for
`scaleDownIdleSeconds` above the minimum. Who gets a freed slot (waiters, sessions' pinning) is
runtime/process/scheduling.py, which this pool inherits.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..errors import DeployError, handler_failure_message
from ..manifest import FunctionSpec
from .budget import WorkerBudget
from .errors import WorkerCrashedError, WorkerUnavailableError
from .instances import instance_bounds, instance_slots, with_runpod_concurrency
from .protocol import DEFAULT_CREDITS
from .scheduling import SlotScheduler
from .worker_process import WorkerProcess

__all__ = ("WorkerPool",)

log = logging.getLogger("fnstream.process")

_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent.parent)
# Workers that die before they are ready this many times in a row mark the pool broken.
MAX_START_FAILURES = 3
# A deploy waits at most this long (or the function's timeout, if shorter) for the code's import.
MAX_LOAD_SECONDS = 120.0
# A worker's start (a fresh interpreter, then the import) is not a call: on a busy host it takes
# seconds, whatever the function's `timeout` (a 1.5 s one failed its deploys under load).
MIN_LOAD_SECONDS = 30.0
EXIT_MARGIN = 1.0  # s for a worker to exit once its preStop's time is up (stop(pre_stop_grace=...))


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "closed its connection"
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class WorkerPool(SlotScheduler):
    """The workers of one deployment: start, hand out slots, take back, scale, replace, stop."""

    def __init__(self, spec: FunctionSpec, code_roots: list[Path], *, credits: int = DEFAULT_CREDITS,
                 budget: WorkerBudget | None = None) -> None:
        self.spec = spec
        self.budget = budget if budget is not None else WorkerBudget()  # the node's (runtime.maxWorkerProcesses)
        self.code_roots = list(code_roots)
        self.min_instances, self.max_instances = instance_bounds(spec)
        self.idle_seconds = float(spec.scaleDownIdleSeconds)
        self.slots = instance_slots(spec, "sync")  # the real value once the code's kind is known
        self.credits = credits
        self.lock = threading.Lock()
        self.workers = []
        self._waiters = deque()
        self._spawning = 0
        self.restarts = 0
        self._start_failures = 0
        self.broken: str | None = None
        self.init_error: str | None = None
        self.stopping = False
        self.pre_stop_grace: float | None = None  # given at stop(): the preStop's bound in each worker
        # Until the first worker has imported the code, nothing is deployed and no worker replaced.
        self.validated = False
        self.kind: str | None = None
        self.runpod: dict[str, Any] | None = None  # the first worker's runpod.serverless.start() options
        self.load_error: str | None = None
        self._loaded = threading.Event()
        self._wake = threading.Event()
        self.cold_starts = 0
        self.sessions_moved = 0  # sessions whose worker died, continued on another (their state lost)
        self.exclusive_lost = 0  # exclusive sessions that had to share their worker (scheduling.py)

    #: a cancelled handler's thread can be interrupted (Java); else a lone `def` handler past its
    #: timeout is killed with its worker at once (a Python thread cannot be stopped)
    interrupts_threads = False

    def launch(self, child_sock: socket.socket) -> subprocess.Popen[bytes]:
        """Start one worker process talking over `child_sock` (a fresh interpreter, never a fork)."""
        # The function's `environment` is its worker's process environment (RunPod workers read os.getenv).
        env = {**os.environ, **self.spec.environment, "MALLOC_ARENA_MAX": "2",
               "PYTHONPATH": os.pathsep.join(p for p in (_PROJECT_ROOT, os.environ.get("PYTHONPATH")) if p)}
        return subprocess.Popen(
            [sys.executable, "-m", "runtime.process.worker", str(child_sock.fileno())],
            pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, env=env, cwd=_PROJECT_ROOT,
            process_group=0)  # its own group: what its handlers spawn ends with it (kill_group)

    def _live(self) -> list[WorkerProcess]:
        """Workers that serve or will serve (called with the lock held)."""
        return [w for w in self.workers if w.state in ("starting", "ready")]

    def start(self) -> None:
        """Start the first worker: it imports the code, which `wait_loaded` checks before the rest start.

        The pool holds max(minInstances, 1) on the node first: DeployError
        429 when the node has no room (the registry joins it first, naming what it replaces)."""
        why = self.budget.join(self, self.reserved())
        if why is not None:
            raise DeployError(f"function {self.name!r}: {why}", code=200429, status=429)
        self._spawn()

    def reserved(self) -> int:
        """Workers the node holds for this pool from its deploy on: its minimum, and at least one —
        the importing worker's, then the cold start's of a scale-to-zero function (process/budget.py)."""
        return max(self.min_instances, 1)

    def wait_loaded(self, timeout: float | None = None) -> str:
        """Block until the first worker imported the code; its handler kind, or DeployError.

        The user's code is imported only here, in a worker: an import that raises, exits or
        crashes fails the deploy with the worker's message and never touches the server. With
        `minInstances: 0` that worker is the one the idle rule stops first.
        """
        if timeout is None:
            timeout = min(max(float(self.spec.timeout), MIN_LOAD_SECONDS), MAX_LOAD_SECONDS)
        if not self._loaded.wait(timeout):
            self.load_error = (f"function {self.name!r}: its worker process did not finish importing the code "
                               f"within {timeout:g} s")
        if self.load_error is not None or self.kind is None:
            raise DeployError(self.load_error or f"function {self.name!r}: its worker process reported no handler")
        with self.lock:
            self.spec = with_runpod_concurrency(self.spec, (self.runpod or {}).get("concurrency"))
            self.slots = instance_slots(self.spec, self.kind)
            self.validated = True
            missing = self.min_instances - len(self.workers) if not self.stopping else 0
        self.budget.keep(self, self.reserved())
        for _ in range(missing):
            self._spawn()
        threading.Thread(target=self._supervise, name=f"fnstream-scale-{self.name}", daemon=True).start()
        return self.kind

    def abort(self) -> None:
        """Kill every worker of a pool whose deploy failed (it never served; no preStop)."""
        with self.lock:
            self.stopping = True
            workers = list(self.workers)
            self._fail_waiters(WorkerUnavailableError("the deploy was refused"))
        self.budget.leave(self)
        self._wake.set()
        for worker in workers:
            worker.kill("the deploy was refused")

    def _spawn(self, counted: bool = False) -> None:
        """Start one worker (`counted`: already taken from the node's budget)."""
        if not counted and not self.budget.take(self):  # within the pool's hold: always
            raise DeployError(f"function {self.name!r}: no room on this node for another worker process "
                              f"(runtime.maxWorkerProcesses {self.budget.limit})", code=200429, status=429)
        try:
            worker = WorkerProcess(self)
        except BaseException:
            self.budget.ended(self)
            raise
        with self.lock:
            self.workers.append(worker)
        log.info("function %s: started worker %d", self.name, worker.pid)

    def _spawn_in_background(self, counted: bool = False) -> None:
        """Called with the lock held: start one more worker from a thread (Popen is not for the loop)."""
        self._spawning += 1

        def run() -> None:
            try:
                self._spawn(counted)
            except OSError as exc:
                with self.lock:
                    self.broken = f"function {self.name!r}: cannot start a worker process: {exc}"
                    self._fail_waiters(WorkerUnavailableError(self.broken))
            finally:
                with self.lock:
                    self._spawning -= 1
        threading.Thread(target=run, name=f"fnstream-spawn-{self.name}", daemon=True).start()

    def _maybe_scale_up(self) -> None:
        """Called with the lock held: one more worker when invocations wait and none is starting."""
        if not self.validated or self.stopping or self.broken is not None or not self._waiters:
            return
        live = self._live()
        starting = sum(1 for w in live if w.state == "starting") + self._spawning
        if starting:
            return
        if len(live) < self.max_instances and self.budget.take(self):
            if not any(w.state == "ready" for w in live):
                self.cold_starts += 1
            self._spawn_in_background(counted=True)
            return
        # No room on the node (runtime.maxWorkerProcesses) or maxInstances: calls wait for a slot,
        # on an instance no exclusive session keeps to itself.
        self._share_if_starved()

    # -- supervision (reader threads, the scale thread) ----------------------------------------
    def _on_loaded(self, kind: str | None, error: str | None, runpod: dict[str, Any] | None = None) -> None:
        if self._loaded.is_set():
            return  # a later worker: a failure there surfaces as init_error (4201)
        self.kind, self.load_error, self.runpod = kind, error, runpod
        self._loaded.set()

    def _on_ready(self, worker: WorkerProcess, init_error: str | None) -> None:
        with self.lock:
            self._start_failures = 0
            worker.ready = True
            worker.idle_since = time.monotonic()
            if init_error is not None and self.init_error is None:
                self.init_error = init_error
            if worker.state != "starting":
                return
            stop = self.stopping
            if not stop:
                worker.state = "ready"
                self._dispatch()
        log.info("function %s: worker %d ready", self.name, worker.pid)
        if stop:
            worker.stop()

    def _on_exit(self, worker: WorkerProcess) -> None:
        how = _describe_exit(worker.returncode)
        self.budget.ended(self)
        with self.lock:
            was = worker.state
            worker.state = "dead"
            if worker in self.workers:
                self.workers.remove(worker)
            jobs = list(worker.jobs.values())
            worker.jobs.clear()
            unplanned = was not in ("stopping", "retiring") and not self.stopping
            if not self._loaded.is_set():  # the first worker died while importing the code
                self.load_error = (f"function {self.name!r}: its worker process {how} while importing "
                                   f"the code (handler {self.spec.handler!r}); see the server log")
                self._loaded.set()
            replace, live = False, 0
            if not self.stopping and self.validated:
                if unplanned:
                    self.restarts += 1
                if unplanned and not worker.ready:
                    self._start_failures += 1
                    if self._start_failures >= MAX_START_FAILURES:
                        self.broken = (f"function {self.name!r}: its worker processes cannot start (the last one "
                                       f"{how}); check the server log, the code and the `memory` limit")
                        self._fail_waiters(WorkerUnavailableError(self.broken))
                if self.broken is None:
                    live = len(self._live()) + self._spawning
                    replace = live < self.min_instances or (bool(self._waiters) and live < self.max_instances)
        why = how if worker.kill_reason is None else f"was killed ({worker.kill_reason})"
        for job in jobs:
            job.finish(("error", WorkerCrashedError(handler_failure_message(
                f"the worker process (pid {worker.pid}) {why} during the invocation"))))
        if unplanned and was != "killed":
            log.error("function %s: worker %d %s", self.name, worker.pid, how)
        if replace and not self.budget.take(self):
            replace = False  # past its hold: only while the node has room (process/budget.py)
        if replace:
            try:
                self._spawn(counted=True)
            except OSError as exc:
                with self.lock:
                    self.broken = f"function {self.name!r}: cannot start a worker process: {exc}"
                    self._fail_waiters(WorkerUnavailableError(self.broken))

    def _supervise(self) -> None:
        """Stop workers idle for `scaleDownIdleSeconds` while more than `minInstances` are up."""
        tick = max(0.05, min(1.0, self.idle_seconds / 4))
        while not self._wake.wait(tick):
            now = time.monotonic()
            retire: list[WorkerProcess] = []
            with self.lock:
                if self.stopping:
                    return
                if self._waiters:
                    self._maybe_scale_up()  # calls that waited for room on the node (process/budget.py)
                else:
                    self.budget.satisfied(self)
                # Another function waits for room on the node: idle workers above the hold go now
                # (stopping the one a scale-to-zero function holds anyway would free nothing).
                pressed = self.budget.pressed(self)
                idle_for = 0.0 if pressed else self.idle_seconds
                live = self._live()
                spare = len(live) - (self.reserved() if pressed else self.min_instances)
                for worker in sorted(live, key=lambda w: w.idle_since):
                    if spare <= 0:
                        break
                    if worker.state == "ready" and worker.busy == 0 and now - worker.idle_since >= idle_for \
                            and not worker.live_sessions(now):
                        worker.state = "stopping"
                        retire.append(worker)
                        spare -= 1
            for worker in retire:
                log.info("function %s: worker %d idle for %g s: stopping it", self.name, worker.pid,
                         idle_for)
                worker.send({"t": "stop"})

    # -- stop ----------------------------------------------------------------------------------
    def stop(self, grace: float = 10.0, pre_stop_grace: float | None = None) -> threading.Thread:
        """Stop every worker (preStop runs in each); busy ones finish their invocations first.

        `pre_stop_grace` bounds each worker's preStop (besides min(timeout, 180 s)). Workers still
        alive `grace` s (plus `pre_stop_grace` and EXIT_MARGIN, if given) later are killed.
        Returns the thread that does that.
        """
        with self.lock:
            self.stopping = True
            self.pre_stop_grace = pre_stop_grace
            workers = list(self.workers)
            idle = [w for w in workers if w.state == "ready" and w.busy == 0]
            self._fail_waiters(WorkerUnavailableError(f"function {self.name!r} is being stopped"))
        self.budget.leave(self)
        self._wake.set()
        for worker in idle:
            worker.stop()
        limit = grace if pre_stop_grace is None else grace + pre_stop_grace + EXIT_MARGIN
        reaper = threading.Thread(target=self._reap, args=(workers, limit), name=f"fnstream-stop-{self.name}",
                                  daemon=True)
        reaper.start()
        return reaper

    def _reap(self, workers: list[WorkerProcess], grace: float) -> None:
        deadline = time.monotonic() + grace
        for worker in workers:
            if not worker.exited.wait(max(0.0, deadline - time.monotonic())):
                worker.kill(f"still running {grace:g} s after the function was stopped")
                worker.exited.wait()

    async def aclose(self, grace: float = 10.0, pre_stop_grace: float | None = None) -> None:
        reaper = self.stop(grace, pre_stop_grace)
        await asyncio.to_thread(reaper.join)

    def _gives_way(self, worker: WorkerProcess) -> bool:
        """Called with the lock held, `worker` idle after a call: should it exit, its room being
        wanted by another function (or a deploy) with fewer scale-outs (process/budget.py)?"""
        return (self.validated and len(self._live()) > self.reserved() and self.budget.yields(self)
                and not worker.live_sessions(time.monotonic()))

    def describe(self) -> dict[str, Any]:
        with self.lock:
            return {"minInstances": self.min_instances, "maxInstances": self.max_instances,
                    "instanceConcurrency": self.slots, "scaleDownIdleSeconds": self.idle_seconds,
                    "waiting": len(self._waiters), "restarts": self.restarts, "coldStarts": self.cold_starts,
                    "sessionsMoved": self.sessions_moved, "exclusiveLost": self.exclusive_lost,
                    "error": self.broken, "instances": len(self.workers),
                    "workers": [w.describe() for w in self.workers]}
