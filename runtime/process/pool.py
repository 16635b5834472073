"""The per-function pool of worker processes: slots, scaling, sessions and supervision.

Each worker is a fresh interpreter (`python -m runtime.process.worker`), never a fork of the
event-loop process, and runs up to `slots` invocations at once (manifest `instanceConcurrency`).
The frontend reads each worker from a dedicated thread, so a pool can be started by a synchronous
deploy before any event loop runs, and a dead worker is noticed (EOF on its socket) at once.

Scaling: the pool keeps `minInstances` workers, starts one more (up to `maxInstances`) whenever an
invocation waits for a free slot, and a supervisor thread stops workers idle for
`scaleDownIdleSeconds` above the minimum. A freed slot is handed straight to the oldest waiter
that can use it (a session waits for its own worker), so nothing is woken for nothing.
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

from ..errors import (
    ConcurrencyLimitError,
    DeployError,
    FunctionServiceError,
    StreamClosedError,
    handler_failure_message,
)
from ..manifest import FunctionSpec
from ..threadpool import call_threadsafe
from .errors import WorkerCrashedError, WorkerUnavailableError, error_from_wire
from .instances import instance_bounds, instance_slots
from .protocol import (
    DEFAULT_CREDITS,
    TRY_SEND_MAX,
    Connection,
    ConnectionClosed,
    Error,
    Invoke,
    Item,
    ProtocolError,
    Result,
    ToFrontend,
    ToWorker,
    Write,
)
from .streams_bridge import StreamBridge

if TYPE_CHECKING:
    from ..sessions import Session
    from ..surface import PooledInvocation

__all__ = ("Job", "WorkerPool", "WorkerProcess")

log = logging.getLogger("fnstream.process")

State = Literal["starting", "ready", "retiring", "killed", "stopping", "dead"]
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent.parent)
# Workers that die before they are ready this many times in a row mark the pool broken.
MAX_START_FAILURES = 3
# A deploy waits at most this long (or the function's timeout, if shorter) for the code's import.
MAX_LOAD_SECONDS = 120.0


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
        # Writes that found the channel full (its client is slow). They wait here, on the loop,
        # instead of blocking the worker's reader thread (and so every other invocation on the
        # worker); credits are held back meanwhile, so this holds at most `credits` writes.
        self.backlog: deque[str] | None = None
        self.deferred: tuple[str, Any] | None = None  # the outcome, held until the backlog is in

    def finish(self, outcome: tuple[str, Any]) -> None:
        """Resolve from any thread; the first outcome wins."""
        call_threadsafe(self.loop, _resolve, self.future, outcome)


class WorkerProcess:
    """One worker: its process, its socket, its slots and the thread that reads it."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = pool.launch(child_sock)
        finally:
            child_sock.close()
        self.pid = self.proc.pid
        self.conn: Connection[ToWorker, ToFrontend] = Connection(parent_sock)
        self.state: State = "starting"
        self.ready = False
        self.invocations = 0
        self.started = time.time()
        self.jobs: dict[str, Job] = {}
        self.busy = 0                      # slots taken (an acquired slot may not have its job yet)
        self.idle_since = time.monotonic()
        self.sessions: dict[str, Session] = {}  # sessions pinned here (a worker with live ones stays up)
        self.exclusive: Session | None = None    # a session with concurrency -1 owns this worker
        self.kill_reason: str | None = None
        self.exited = threading.Event()
        self.returncode: int | None = None
        self.streams = StreamBridge(self.send, pool.spec.tenant)
        self._batch: list[bytes] = []  # frames queued on the loop this turn (send_on_loop)
        self._inbox: list[tuple[Job, Write | Item | Result | Error]] = []  # invocation frames for the loop
        self._inbox_lock = threading.Lock()
        self.conn.send({"t": "hello", "spec": pool.spec.model_dump(mode="json"),
                        "code_roots": [str(p) for p in pool.code_roots], "credits": pool.credits})
        self._reader = threading.Thread(target=self._read_loop, name=f"fnstream-worker-{self.pid}", daemon=True)
        self._reader.start()

    @property
    def slots(self) -> int:
        return self.pool.slots

    def free(self) -> int:
        return self.slots - self.busy if self.state == "ready" else 0

    def live_sessions(self, now: float) -> int:
        """Pinned sessions not yet expired (expired ones are forgotten here)."""
        for sid in [sid for sid, s in self.sessions.items() if s.expired(now)]:
            if self.exclusive is self.sessions.pop(sid):
                self.exclusive = None
        return len(self.sessions)

    def describe(self) -> dict[str, Any]:
        state = ("busy" if self.busy else "idle") if self.state == "ready" else self.state
        now = time.monotonic()
        return {"pid": self.pid, "state": state, "busySlots": self.busy, "slots": self.slots,
                "invocations": self.invocations, "startedAt": round(self.started, 3),
                "sessions": self.live_sessions(now)}

    # -- commands (any thread) -----------------------------------------------------------------
    def send(self, frame: ToWorker) -> bool:
        try:
            self.conn.send(frame)
            return True
        except (ConnectionClosed, ProtocolError):
            return False  # the worker is dead or dying; the reader thread handles that

    def send_soon(self, frame: ToWorker) -> bool | None:
        """Send without blocking the caller (the event loop); None when it must go from a thread."""
        try:
            return self.conn.try_send(frame)
        except (ConnectionClosed, ProtocolError):
            return False

    def send_on_loop(self, frame: ToWorker) -> bool:
        """On the event loop: queue a small frame to go out with the others queued in this loop
        turn, in one system call (many invocations start per turn under load). False when the
        frame is large: the caller sends it from a thread."""
        data = self.conn.pack(frame)
        if len(data) > TRY_SEND_MAX:
            return False
        self._batch.append(data)
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self._flush_batch)
        return True

    def _flush_batch(self) -> None:
        data = b"".join(self._batch)
        self._batch.clear()
        try:
            if self.conn.try_send_bytes(data) is None:  # another sender holds the socket: wait in a thread
                asyncio.get_running_loop().run_in_executor(None, self._send_bytes, data)
        except ConnectionClosed:
            pass  # the worker is dead or dying; the reader thread handles that

    def _send_bytes(self, data: bytes) -> None:
        try:
            self.conn.send_bytes(data)
        except ConnectionClosed:
            pass

    def cancel(self, inv_id: str, reason: str) -> None:
        """Ask the worker to stop one invocation; never blocks the caller (often the event loop)."""
        frame: ToWorker = {"t": "cancel", "id": inv_id, "reason": reason}
        if self.send_soon(frame) is None:
            threading.Thread(target=self.send, args=(frame,), daemon=True).start()

    def kill(self, reason: str) -> None:
        """Kill the worker now (timeout, ignored cancel); every invocation on it fails naming `reason`."""
        with self.pool.lock:
            if self.state in ("dead", "killed"):
                return
            self.state = "killed"
            self.kill_reason = reason
        log.warning("function %s: killing worker %d: %s", self.pool.name, self.pid, reason)
        self.kill_group()

    def kill_group(self) -> None:
        """SIGKILL the worker and whatever its handlers started (its process group: launch)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # all gone; the reader thread is reaping the worker
        except PermissionError:  # not a group of ours (a pool that launched without one)
            self.proc.kill()

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
            self.kill_group()  # a handler's leftover children end with their worker
            self.conn.close()
            self.streams.release()
            self.exited.set()
            self.pool._on_exit(self)

    def _handle(self, msg: ToFrontend) -> None:
        if msg["t"] == "write" or msg["t"] == "item" or msg["t"] == "result" or msg["t"] == "error":
            if msg["t"] == "error" and msg.get("retire"):
                with self.pool.lock:
                    if self.state == "ready":
                        self.state = "retiring"  # it exits once its invocations end: no new ones
            job = self.jobs.get(msg["id"])
            if job is None:
                return
            # To the loop, in order, many frames per wake-up: one loop callback for all that arrived
            # meanwhile, instead of a cross-thread wake-up per frame (and per stream).
            with self._inbox_lock:
                self._inbox.append((job, msg))
                first = len(self._inbox) == 1
            if first:
                call_threadsafe(job.loop, self._take_inbox)
        elif msg["t"] == "loaded":
            self.pool._on_loaded(msg.get("kind"), msg.get("error"))
        elif msg["t"] == "ready":
            self.pool._on_ready(self, msg.get("init_error"))
        elif msg["t"] == "log":
            # As the worker made it, tagged with its pid and the invocation it names (runtime/logs.py
            # formats both ways) — by the frontend: the worker runs the user's code, so a record
            # may name only an invocation this worker runs, and is always of this worker's function.
            job = self.jobs.get(str(msg.get("invocation_id") or ""))
            inv = job.inv if job is not None else None
            trace_id, invocation_id = (inv.trace_id, inv.id) if inv is not None else ("", "")
            logging.getLogger(str(msg["name"])).log(int(msg["level"]), "%s", msg["msg"], extra={
                "worker": self.pid, "function": self.pool.name, "trace_id": trace_id, "invocation_id": invocation_id})
        elif msg["t"] == "stopped":
            if msg.get("error"):
                log.error("function %s: worker %d: %s", self.pool.name, self.pid, msg["error"])
        elif msg["t"] == "stream_call":
            self.streams.handle(msg)

    def _take_inbox(self) -> None:
        """On the loop: deliver the invocation frames the reader thread queued, then their credits."""
        with self._inbox_lock:
            frames, self._inbox = self._inbox, []
        for job, msg in frames:
            if msg["t"] == "write":
                self._deliver(job, msg["p"])
            elif msg["t"] == "item":
                self._aggregate(job, msg["v"])
            elif msg["t"] == "result":
                self._finish(job, ("result", json.loads(msg["json"])))
            else:
                self._finish(job, ("error", job.error or error_from_wire(msg["error"], msg["message"])))

    @staticmethod
    def _finish(job: Job, outcome: tuple[str, Any]) -> None:
        if job.backlog is not None:
            job.deferred = outcome  # its last writes are still on their way into the channel
            return
        _resolve(job.future, outcome)

    def _credit(self, job: Job, n: int) -> None:
        self.send_on_loop({"t": "credit", "id": job.inv.id, "n": n})  # small: always queued

    def _deliver(self, job: Job, payloads: list[str]) -> None:
        """On the loop: put a (coalesced) write frame into the invocation's channel, give the
        credits back. What does not fit waits in the job's backlog (credits held back)."""
        if job.backlog is not None:
            job.backlog.extend(payloads)
            return
        inv = job.inv
        for i, payload in enumerate(payloads):
            try:
                fits = inv.channel.try_put(payload)
            except StreamClosedError as exc:
                self.cancel(inv.id, exc.message)  # the client left or the deadline passed
                return
            if not fits:
                job.backlog = deque(payloads[i:])
                job.loop.create_task(self._drain(job), name=f"backlog-{inv.id}")
                payloads = payloads[:i]
                break
        if payloads:
            self._credit(job, len(payloads))

    async def _drain(self, job: Job) -> None:
        """Move the backlog into the channel as the client reads, a credit per write."""
        inv = job.inv
        while job.backlog:
            payload = job.backlog.popleft()
            try:
                await inv.channel.put(payload)
            except StreamClosedError as exc:
                self.cancel(inv.id, exc.message)  # the client left: what is left here is discarded
                job.backlog.clear()
                break
            self._credit(job, 1)
        job.backlog = None
        outcome, job.deferred = job.deferred, None
        if outcome is not None:
            _resolve(job.future, outcome)

    def _aggregate(self, job: Job, items: list[Any]) -> None:
        """Generator items of a plain JSON request: collected (bounded by maxResponseSize)."""
        inv = job.inv
        try:
            for item in items:
                inv.add_item_blocking(item)
        except StreamClosedError as exc:
            self.cancel(inv.id, exc.message)  # the client left or the deadline passed
            return
        except FunctionServiceError as exc:
            job.error = exc  # e.g. the aggregated result is too large: fail with that, not "cancelled"
            self.cancel(inv.id, exc.message)
            return
        self._credit(job, len(items))


class _Waiter:
    __slots__ = ("future", "loop", "session")

    def __init__(self, loop: asyncio.AbstractEventLoop, session: Session | None) -> None:
        self.loop = loop
        self.future: asyncio.Future[tuple[WorkerProcess, bool]] = loop.create_future()
        self.session = session


class WorkerPool:
    """The workers of one deployment: start, hand out slots, take back, scale, replace, stop."""

    def __init__(self, spec: FunctionSpec, code_roots: list[Path], *, credits: int = DEFAULT_CREDITS) -> None:
        self.spec = spec
        self.code_roots = list(code_roots)
        self.min_instances, self.max_instances = instance_bounds(spec)
        self.idle_seconds = float(spec.scaleDownIdleSeconds)
        self.slots = instance_slots(spec, "sync")  # the real value once the code's kind is known
        self.credits = credits
        self.lock = threading.Lock()
        self.workers: list[WorkerProcess] = []
        self._waiters: deque[_Waiter] = deque()
        self._spawning = 0
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
        self._wake = threading.Event()
        self.cold_starts = 0
        self.sessions_moved = 0  # sessions whose worker died, continued on another (their state lost)

    @property
    def name(self) -> str:
        return self.spec.name

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
        """Start the first worker: it imports the code, which `wait_loaded` checks before the rest start."""
        self._spawn()

    def wait_loaded(self, timeout: float | None = None) -> str:
        """Block until the first worker imported the code; its handler kind, or DeployError.

        The user's code is imported only here, in a worker: an import that raises, exits or
        crashes fails the deploy with the worker's message and never touches the server. With
        `minInstances: 0` that worker is the one the idle rule stops first.
        """
        if timeout is None:
            timeout = min(float(self.spec.timeout), MAX_LOAD_SECONDS)
        if not self._loaded.wait(timeout):
            self.load_error = (f"function {self.name!r}: its worker process did not finish importing the code "
                               f"within {timeout:g} s")
        if self.load_error is not None or self.kind is None:
            raise DeployError(self.load_error or f"function {self.name!r}: its worker process reported no handler")
        with self.lock:
            self.slots = instance_slots(self.spec, self.kind)
            self.validated = True
            missing = self.min_instances - len(self.workers) if not self.stopping else 0
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
        self._wake.set()
        for worker in workers:
            worker.kill("the deploy was refused")

    def _spawn(self) -> None:
        worker = WorkerProcess(self)
        with self.lock:
            self.workers.append(worker)
        log.info("function %s: started worker %d", self.name, worker.pid)

    def _spawn_in_background(self) -> None:
        """Called with the lock held: start one more worker from a thread (Popen is not for the loop)."""
        self._spawning += 1

        def run() -> None:
            try:
                self._spawn()
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
        if starting == 0 and len(live) < self.max_instances:
            if not any(w.state == "ready" for w in live):
                self.cold_starts += 1
            self._spawn_in_background()

    # -- hand out / take back ------------------------------------------------------------------
    async def acquire(self, session: Session | None = None) -> tuple[WorkerProcess, bool]:
        """A slot on a worker (the session's own, if pinned) and whether the session restarted.

        Waits while every slot is taken; raises WorkerUnavailableError when none ever will be.
        """
        loop = asyncio.get_running_loop()
        with self.lock:
            self._check_usable()
            if session is not None and session.exclusive and session.worker is None \
                    and not self._exclusive_share_left(session):
                raise ConcurrencyLimitError(
                    f"function {self.name!r}: exclusive sessions may own at most {self.max_instances - 1} of its "
                    f"{self.max_instances} instance(s) (maxInstances), one always stays shared; all are owned"
                    if self.max_instances > 1 else
                    f"function {self.name!r} has one instance (maxInstances 1): an exclusive session "
                    "(concurrency -1) would lock every other caller out; raise maxInstances or use concurrency >= 1")
            picked = self._pick(session)
            if picked is not None:
                return picked
            waiter = _Waiter(loop, session)
            self._waiters.append(waiter)
            self._maybe_scale_up()
        try:
            return await waiter.future
        except BaseException:
            fut = waiter.future
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result()[0], None)  # handed a slot just as we were cancelled
            else:
                with self.lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)  # if a slot is on its way, `_hand` gives it back
            raise

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise WorkerUnavailableError(self.broken)
        if self.stopping:
            raise WorkerUnavailableError(f"function {self.name!r} is being stopped")

    def _exclusive_share_left(self, session: Session) -> bool:
        """Called with the lock held: may `session` own one more worker? Exclusive sessions together own
        at most maxInstances - 1, so that one instance always serves everyone else: no session, whatever
        its TTL, starves the function's other callers (they scale out onto it instead)."""
        now = time.monotonic()
        owned = 0
        for worker in self.workers:
            if worker.exclusive is not None:
                worker.live_sessions(now)  # forgets an expired owner
            if worker.exclusive is not None and worker.exclusive is not session:
                owned += 1
        return owned < self.max_instances - 1

    def _pick(self, session: Session | None) -> tuple[WorkerProcess, bool] | None:
        """Called with the lock held: take a slot for `session` (or anyone) if one is free."""
        if session is not None and session.worker is not None:
            pinned: WorkerProcess = session.worker
            if pinned in self.workers and pinned.state == "ready":
                if pinned.free() <= 0:
                    return None  # the session waits for its own worker
                return self._take(pinned, session)
            session.restarted = True  # its worker died (or is going): continue on another, and say so
            self.sessions_moved += 1
            pinned.sessions.pop(session.id, None)
            if pinned.exclusive is session:
                pinned.exclusive = None
            session.worker = None
        best: WorkerProcess | None = None
        now = time.monotonic()
        for worker in self.workers:
            free = worker.free()
            if free <= 0:
                continue
            if worker.exclusive is not None:
                worker.live_sessions(now)  # forgets an expired owner
                if worker.exclusive is not None and worker.exclusive is not session:
                    continue  # owned by a live exclusive session
            if session is not None and session.exclusive and (worker.busy or worker.live_sessions(now)
                                                              or not self._exclusive_share_left(session)):
                continue
            if best is None or free > best.free():
                best = worker
        if best is None:
            return None
        return self._take(best, session)

    def _take(self, worker: WorkerProcess, session: Session | None) -> tuple[WorkerProcess, bool]:
        restarted = False
        worker.busy += 1
        if session is not None:
            if session.worker is not worker:
                session.worker = worker
                session.on_end.append(self._unpin)
                if session.exclusive:
                    worker.exclusive = session
            worker.sessions[session.id] = session
            restarted, session.restarted = session.restarted, False
        return worker, restarted

    def _unpin(self, session: Session) -> None:
        with self.lock:
            for worker in self.workers:
                if worker.sessions.get(session.id) is session:
                    del worker.sessions[session.id]
                if worker.exclusive is session:
                    worker.exclusive = None
            self._dispatch()

    def _dispatch(self) -> None:
        """Called with the lock held: hand free slots to waiters, oldest first."""
        if not self._waiters:
            return
        for waiter in list(self._waiters):
            if waiter.future.done():
                self._waiters.remove(waiter)
                continue
            picked = self._pick(waiter.session)
            if picked is None:
                if waiter.session is None:
                    break  # no free slot for anyone: later waiters wait too (pinned ones aside)
                continue
            self._waiters.remove(waiter)
            call_threadsafe(waiter.loop, self._hand, waiter, picked)
        self._maybe_scale_up()

    def _hand(self, waiter: _Waiter, picked: tuple[WorkerProcess, bool]) -> None:
        """On the waiter's loop: give it the slot, or give the slot back if it stopped waiting."""
        if waiter.future.done():
            self.release(picked[0], None)
        else:
            waiter.future.set_result(picked)

    def _fail_waiters(self, error: FunctionServiceError) -> None:
        """Called with the lock held."""
        for waiter in self._waiters:
            call_threadsafe(waiter.loop, _fail, waiter.future, error)
        self._waiters.clear()

    def begin(self, worker: WorkerProcess, inv: PooledInvocation, session: Session | None = None,
              restarted: bool = False) -> tuple[Job, Invoke]:
        """The job of `inv` on the slot it holds on `worker`, and the frame that starts it there."""
        job = Job(inv)
        worker.jobs[inv.id] = job
        worker.invocations += 1
        frame: Invoke = {"t": "invoke", "id": inv.id, "trace_id": inv.trace_id, "event": inv.event,
                         "streaming": inv.streaming, "timeout": inv.remaining(),
                         "max_write_size": inv.max_write_size,
                         "session_id": session.id if session is not None else None, "session_restarted": restarted}
        return job, frame

    def release(self, worker: WorkerProcess, job: Job | None) -> None:
        """A slot on `worker` is free again: hand it on, or stop the worker if it should go."""
        stop = False
        with self.lock:
            if job is not None and worker.jobs.get(job.inv.id) is job:
                del worker.jobs[job.inv.id]
            worker.busy = max(0, worker.busy - 1)
            if worker.busy == 0:
                worker.idle_since = time.monotonic()
            if worker.state == "ready":
                if self.stopping and worker.busy == 0:
                    stop = True
                else:
                    self._dispatch()
        if stop:
            worker.stop()

    def only_job(self, worker: WorkerProcess, job: Job) -> bool:
        """Whether `job` is the only invocation on `worker` (killing it then harms nobody else)."""
        with self.lock:
            return worker.busy <= 1 and list(worker.jobs.values()) in ([job], [])

    # -- supervision (reader threads, the scale thread) ----------------------------------------
    def _on_loaded(self, kind: str | None, error: str | None) -> None:
        if self._loaded.is_set():
            return  # a later worker: a failure there surfaces as init_error (4201)
        self.kind, self.load_error = kind, error
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
            replace = False
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
        if replace:
            try:
                self._spawn()
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
                live = self._live()
                spare = len(live) - self.min_instances
                for worker in sorted(live, key=lambda w: w.idle_since):
                    if spare <= 0:
                        break
                    if worker.state == "ready" and worker.busy == 0 and now - worker.idle_since >= self.idle_seconds \
                            and not worker.live_sessions(now):
                        worker.state = "stopping"
                        retire.append(worker)
                        spare -= 1
            for worker in retire:
                log.info("function %s: worker %d idle for %g s: stopping it", self.name, worker.pid,
                         self.idle_seconds)
                worker.send({"t": "stop"})

    # -- stop ----------------------------------------------------------------------------------
    def stop(self, grace: float = 10.0) -> threading.Thread:
        """Stop every worker (preStop runs in each); busy ones finish their invocations first.

        Workers still alive after `grace` seconds are killed. Returns the thread that does that.
        """
        with self.lock:
            self.stopping = True
            workers = list(self.workers)
            idle = [w for w in workers if w.state == "ready" and w.busy == 0]
            self._fail_waiters(WorkerUnavailableError(f"function {self.name!r} is being stopped"))
        self._wake.set()
        for worker in idle:
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
            return {"minInstances": self.min_instances, "maxInstances": self.max_instances,
                    "instanceConcurrency": self.slots, "scaleDownIdleSeconds": self.idle_seconds,
                    "waiting": len(self._waiters), "restarts": self.restarts, "coldStarts": self.cold_starts,
                    "sessionsMoved": self.sessions_moved,
                    "error": self.broken, "instances": len(self.workers),
                    "workers": [w.describe() for w in self.workers]}



def _fail(fut: asyncio.Future[Any], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)
