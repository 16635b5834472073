"""The per-function pool of worker processes and its supervision.

Each worker is a fresh interpreter (`python -m runtime.process.worker`), never a fork of the
event-loop process. The frontend reads each worker from a dedicated thread, so a pool can be
started by a synchronous deploy before any event loop runs, and a dead worker is noticed (EOF on
its socket) and replaced at once, whether or not an invocation was running on it.
"""
from __future__ import annotations

import asyncio
import json
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
from typing import TYPE_CHECKING, Any, Literal

from ..errors import DeployError, FunctionServiceError, StreamClosedError, handler_failure_message
from ..manifest import FunctionSpec
from .errors import WorkerCrashedError, WorkerUnavailableError, error_from_wire
from .protocol import (
    DEFAULT_CREDITS,
    Connection,
    ConnectionClosed,
    Invoke,
    Item,
    ProtocolError,
    ToFrontend,
    ToWorker,
    Write,
)
from .streams_bridge import StreamBridge

if TYPE_CHECKING:
    from ..surface import PooledInvocation

__all__ = ("WorkerPool", "WorkerProcess", "Job", "default_instances")

log = logging.getLogger("fnstream.process")

State = Literal["starting", "idle", "busy", "killed", "retiring", "stopping", "dead"]
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent.parent)
# Workers that die before they are ready this many times in a row mark the pool broken.
MAX_START_FAILURES = 3
# A deploy waits at most this long (or the function's timeout, if shorter) for the code's import.
MAX_LOAD_SECONDS = 120.0


def default_instances(concurrency: int) -> int:
    return max(1, min(concurrency, os.cpu_count() or 1))


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "closed its connection"
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _resolve(fut: asyncio.Future[tuple[str, Any]], outcome: tuple[str, Any]) -> None:
    if not fut.done():
        fut.set_result(outcome)


class Job:
    """One invocation running on one worker; `future` gets ("result", value) or ("error", exc)."""

    def __init__(self, inv: PooledInvocation) -> None:
        self.inv = inv
        self.loop = inv.loop
        self.future: asyncio.Future[tuple[str, Any]] = inv.loop.create_future()
        self.error: FunctionServiceError | None = None  # set when the frontend refused a write

    def finish(self, outcome: tuple[str, Any]) -> None:
        """Resolve from any thread; the first outcome wins."""
        _call_soon(self.loop, _resolve, self.future, outcome)


class WorkerProcess:
    """One worker: its process, its socket and the thread that reads it."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, "MALLOC_ARENA_MAX": "2",
               "PYTHONPATH": os.pathsep.join(p for p in (_PROJECT_ROOT, os.environ.get("PYTHONPATH")) if p)}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime.process.worker", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, env=env, cwd=_PROJECT_ROOT)
        finally:
            child_sock.close()
        self.pid = self.proc.pid
        self.conn: Connection[ToWorker, ToFrontend] = Connection(parent_sock)
        self.state: State = "starting"
        self.ready = False
        self.invocations = 0
        self.started = time.time()
        self.job: Job | None = None
        self.exited = threading.Event()
        self.returncode: int | None = None
        self.streams = StreamBridge(self.send, pool.spec.tenant)
        self.conn.send({"t": "hello", "spec": pool.spec.model_dump(mode="json"),
                        "code_roots": [str(p) for p in pool.code_roots], "credits": pool.credits})
        self._reader = threading.Thread(target=self._read_loop, name=f"fnstream-worker-{self.pid}", daemon=True)
        self._reader.start()

    def describe(self) -> dict[str, Any]:
        return {"pid": self.pid, "state": self.state, "invocations": self.invocations,
                "startedAt": round(self.started, 3)}

    # -- commands (any thread) -----------------------------------------------------------------
    def send(self, frame: ToWorker) -> bool:
        try:
            self.conn.send(frame)
            return True
        except (ConnectionClosed, ProtocolError):
            return False  # the worker is dead or dying; the reader thread handles that

    def cancel(self, inv_id: str, reason: str) -> None:
        self.send({"t": "cancel", "id": inv_id, "reason": reason})

    def kill(self, reason: str) -> None:
        """Kill the worker now (timeout, ignored cancel); the pool starts a replacement."""
        with self.pool.lock:
            if self.state in ("dead", "killed"):
                return
            self.state = "killed"
        log.warning("function %s: killing worker %d: %s", self.pool.name, self.pid, reason)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass  # it already exited; the reader thread is reaping it

    def stop(self) -> None:
        """Ask the worker to run preStop and exit."""
        with self.pool.lock:
            if self.state in ("dead", "killed", "stopping"):
                return
            self.state = "stopping"
        self.send({"t": "stop"})

    # -- reader thread -------------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            while True:
                self._handle(self.conn.recv())
        except ConnectionClosed:
            pass
        except Exception as exc:
            log.error("function %s: worker %d: %s: %s; killing it", self.pool.name, self.pid, type(exc).__name__, exc)
            self.proc.kill()
        finally:
            self.returncode = self.proc.wait()
            self.conn.close()
            self.streams.release()
            self.exited.set()
            self.pool._on_exit(self)

    def _handle(self, msg: ToFrontend) -> None:
        if msg["t"] == "write" or msg["t"] == "item":
            self._deliver(msg)
        elif msg["t"] == "result" or msg["t"] == "error":
            job = self.job
            if job is None or job.inv.id != msg["id"]:
                return
            if msg["t"] == "result":
                job.finish(("result", json.loads(msg["json"])))
                return
            if msg.get("retire"):
                with self.pool.lock:
                    self.state = "retiring"  # it exits next: never hand it another invocation
            job.finish(("error", job.error or error_from_wire(msg["error"], msg["message"])))
        elif msg["t"] == "loaded":
            self.pool._on_loaded(msg.get("kind"), msg.get("error"))
        elif msg["t"] == "ready":
            self.pool._on_ready(self, msg.get("init_error"))
        elif msg["t"] == "log":
            logging.getLogger(str(msg["name"])).log(int(msg["level"]), "[worker %d] %s", self.pid, msg["msg"])
        elif msg["t"] == "stopped":
            if msg.get("error"):
                log.error("function %s: worker %d: %s", self.pool.name, self.pid, msg["error"])
        elif msg["t"] == "stream_call":
            self.streams.handle(msg)

    def _deliver(self, msg: Write | Item) -> None:
        """Put one write into the invocation's channel (blocking while it is full), then give a credit."""
        job = self.job
        if job is None or job.inv.id != msg["id"]:
            return
        inv = job.inv
        try:
            if msg["t"] == "write":
                inv.stream.write(msg["p"])
            else:
                inv.add_item_blocking(msg["v"])
        except StreamClosedError as exc:
            self.cancel(inv.id, exc.message)  # the client left or the deadline passed
            return
        except FunctionServiceError as exc:
            job.error = exc  # e.g. the aggregated result is too large: fail with that, not "cancelled"
            self.cancel(inv.id, exc.message)
            return
        self.send({"t": "credit", "id": inv.id, "n": 1})


class WorkerPool:
    """The workers of one deployment: start, hand out, take back, replace, stop."""

    def __init__(self, spec: FunctionSpec, code_roots: list[Path], *, instances: int | None = None,
                 credits: int = DEFAULT_CREDITS) -> None:
        self.spec = spec
        self.code_roots = list(code_roots)
        self.size = instances or default_instances(self.spec.concurrency)
        self.credits = credits
        self.lock = threading.Lock()
        self.workers: list[WorkerProcess] = []
        self._idle: deque[WorkerProcess] = deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.restarts = 0
        self._start_failures = 0
        self.broken: str | None = None
        self.init_error: str | None = None
        self.stopping = False
        # Until the first worker has imported the code, nothing is deployed and no worker replaced.
        self.validated = False
        self.kind: str | None = None
        self.load_error: str | None = None
        self._loaded = threading.Event()

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        """Start the first worker: it imports the code, which `wait_loaded` checks before the rest start."""
        self._spawn()

    def wait_loaded(self, timeout: float | None = None) -> str:
        """Block until the first worker imported the code; its handler kind, or DeployError.

        The user's code is imported only here, in a worker: an import that raises, exits or
        crashes fails the deploy with the worker's message and never touches the server.
        """
        if timeout is None:
            timeout = min(float(self.spec.timeout), MAX_LOAD_SECONDS)
        if not self._loaded.wait(timeout):
            self.load_error = (f"function {self.name!r}: its worker process did not finish importing the code "
                               f"within {timeout:g} s")
        if self.load_error is not None or self.kind is None:
            raise DeployError(self.load_error or f"function {self.name!r}: its worker process reported no handler")
        with self.lock:
            self.validated = True
            missing = self.size - len(self.workers) if not self.stopping else 0
        for _ in range(missing):
            self._spawn()
        return self.kind

    def abort(self) -> None:
        """Kill every worker of a pool whose deploy failed (it never served; no preStop)."""
        with self.lock:
            self.stopping = True
            workers = list(self.workers)
            self._idle.clear()
            self._wake_waiters()
        for worker in workers:
            worker.kill("the deploy was refused")

    def _spawn(self) -> None:
        worker = WorkerProcess(self)
        with self.lock:
            self.workers.append(worker)
        log.info("function %s: started worker %d", self.name, worker.pid)

    # -- hand out / take back ------------------------------------------------------------------
    async def acquire(self) -> WorkerProcess:
        """An idle worker, waiting for one; raises WorkerUnavailableError when there never will be."""
        loop = asyncio.get_running_loop()
        while True:
            with self.lock:
                if self.broken is not None:
                    raise WorkerUnavailableError(self.broken)
                if self.stopping:
                    raise WorkerUnavailableError(f"function {self.name!r} is being stopped")
                while self._idle:
                    worker = self._idle.popleft()
                    if worker.state == "idle":
                        worker.state = "busy"
                        return worker
                waiter = loop.create_future()
                self._waiters.append((loop, waiter))
            try:
                await waiter
            finally:
                with self.lock:
                    if (loop, waiter) in self._waiters:
                        self._waiters.remove((loop, waiter))

    def begin(self, worker: WorkerProcess, inv: PooledInvocation) -> tuple[Job, Invoke]:
        job = Job(inv)
        worker.job = job
        worker.invocations += 1
        frame: Invoke = {"t": "invoke", "id": inv.id, "trace_id": inv.trace_id, "event": inv.event,
                 "streaming": inv.streaming, "timeout": inv.remaining(), "max_write_size": inv.max_write_size}
        return job, frame

    def release(self, worker: WorkerProcess) -> None:
        """The invocation on `worker` is over: make it idle again, or stop it if the pool stops."""
        worker.job = None
        stop = False
        with self.lock:
            if worker.state != "busy":
                return  # killed, retiring or dead: the reader thread replaces it
            if self.stopping:
                stop = True
            else:
                worker.state = "idle"
                self._idle.append(worker)
                self._wake_waiters()
        if stop:
            worker.stop()

    def _wake_waiters(self) -> None:
        """Called with the lock held. Wakes every waiter; each retries (pools are small)."""
        for loop, waiter in self._waiters:
            _call_soon(loop, _resolve_none, waiter)
        self._waiters.clear()

    # -- supervision (reader threads) ----------------------------------------------------------
    def _on_loaded(self, kind: str | None, error: str | None) -> None:
        if self._loaded.is_set():
            return  # a later worker: a failure there surfaces as init_error (4201)
        self.kind, self.load_error = kind, error
        self._loaded.set()

    def _on_ready(self, worker: WorkerProcess, init_error: str | None) -> None:
        with self.lock:
            self._start_failures = 0
            worker.ready = True
            if init_error is not None and self.init_error is None:
                self.init_error = init_error
            if worker.state != "starting":
                return
            if self.stopping:
                stop = True
            else:
                stop = False
                worker.state = "idle"
                self._idle.append(worker)
                self._wake_waiters()
        log.info("function %s: worker %d ready", self.name, worker.pid)
        if stop:
            worker.stop()

    def _on_exit(self, worker: WorkerProcess) -> None:
        how = _describe_exit(worker.returncode)
        with self.lock:
            was = worker.state
            worker.state = "dead"
            if worker in self.workers:
                self.workers.remove(worker)
            job, worker.job = worker.job, None
            replace = not self.stopping and self.validated
            if not self._loaded.is_set():  # the first worker died while importing the code
                self.load_error = (f"function {self.name!r}: its worker process {how} while importing "
                                   f"the code (handler {self.spec.handler!r}); see the server log")
                self._loaded.set()
            if replace:
                self.restarts += 1
                if not worker.ready:
                    self._start_failures += 1
                    if self._start_failures >= MAX_START_FAILURES:
                        self.broken = (f"function {self.name!r}: its worker processes cannot start (the last one "
                                       f"{how}); check the server log, the code and the `memory` limit")
                        replace = False
                        self._wake_waiters()
        if job is not None:
            job.finish(("error", WorkerCrashedError(handler_failure_message(
                f"the worker process (pid {worker.pid}) {how} during the invocation"))))
        if was not in ("stopping", "retiring", "killed") and not self.stopping:
            log.error("function %s: worker %d %s", self.name, worker.pid, how)
        if replace:
            try:
                self._spawn()
            except OSError as exc:
                with self.lock:
                    self.broken = f"function {self.name!r}: cannot start a worker process: {exc}"
                    self._wake_waiters()

    # -- stop ----------------------------------------------------------------------------------
    def stop(self, grace: float = 10.0) -> threading.Thread:
        """Stop every worker (preStop runs in each); busy ones finish their invocation first.

        Workers still alive after `grace` seconds are killed. Returns the thread that does that.
        """
        with self.lock:
            self.stopping = True
            workers = list(self.workers)
            idle = [w for w in workers if w.state in ("idle", "starting")]
            self._idle.clear()
            self._wake_waiters()
        for worker in idle:
            if worker.state == "idle":
                worker.stop()
        reaper = threading.Thread(target=self._reap, args=(workers, grace), name=f"fnstream-stop-{self.name}",
                                  daemon=True)
        reaper.start()
        return reaper

    def _reap(self, workers: list[WorkerProcess], grace: float) -> None:
        deadline = time.monotonic() + grace
        for worker in workers:
            if not worker.exited.wait(max(0.0, deadline - time.monotonic())):
                worker.kill(f"still running {grace:g} s after the function was stopped")
                worker.exited.wait()

    async def aclose(self, grace: float = 10.0) -> None:
        reaper = self.stop(grace)
        await asyncio.to_thread(reaper.join)

    def describe(self) -> dict[str, Any]:
        with self.lock:
            return {"instances": self.size, "restarts": self.restarts, "error": self.broken,
                    "workers": [w.describe() for w in self.workers]}


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass  # that loop is closed: nobody waits for this any more


def _resolve_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
