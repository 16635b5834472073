"""The handle on one worker process: its socket, its slots and the thread that reads it.

Kept apart from the pool (runtime/process/pool.py) and its slot scheduling (scheduling.py): this is
the frontend's end of the process boundary — launching, the frames each way, delivering an
invocation's writes into its channel with credits, kill and stop — and knows its pool only as the
few calls below (`PoolSide`), so it does not import the pool.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..codec import Item as OutputItem
from ..errors import FunctionServiceError, StreamClosedError
from ..fork_guard import forget, release_in_forked_children
from ..manifest import FunctionSpec
from ..runpod_compat import report_progress
from ..threadpool import call_threadsafe
from .errors import error_from_wire
from .protocol import (
    TRY_SEND_MAX,
    Connection,
    ConnectionClosed,
    Error,
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

__all__ = ("PooledCall", "PoolSide", "State", "WorkerProcess")

log = logging.getLogger("fnstream.process")

State = Literal["starting", "ready", "retiring", "killed", "stopping", "dead"]


class PoolSide(Protocol):
    """What a worker needs of its pool (runtime/process/pool.py WorkerPool)."""

    spec: FunctionSpec
    code_roots: list[Path]
    credits: int
    slots: int
    lock: threading.Lock
    pre_stop_grace: float | None

    @property
    def name(self) -> str: ...

    def launch(self, child_sock: socket.socket) -> subprocess.Popen[bytes]: ...

    def _on_loaded(self, kind: str | None, error: str | None, runpod: dict[str, Any] | None = None) -> None: ...

    def _on_ready(self, worker: WorkerProcess, init_error: str | None) -> None: ...

    def _on_exit(self, worker: WorkerProcess) -> None: ...

    def release(self, worker: WorkerProcess, job: PooledCall | None) -> None: ...


def _resolve(fut: asyncio.Future[tuple[str, Any]], outcome: tuple[str, Any]) -> None:
    if not fut.done():
        fut.set_result(outcome)


class PooledCall:
    """One invocation running on one worker; `future` gets ("result", value) or ("error", exc)."""

    def __init__(self, inv: PooledInvocation) -> None:
        self.inv = inv
        self.loop = inv.loop
        self.future: asyncio.Future[tuple[str, Any]] = inv.loop.create_future()
        # What the invocation's task awaits (in place of a shield of `future`, which cost a loop turn):
        # cancelled with the task, while `future` stays for whoever reaps the invocation.
        self.waiter: asyncio.Future[tuple[str, Any]] = inv.loop.create_future()
        self.error: FunctionServiceError | None = None  # set when the frontend refused a write
        # Writes that found the channel full (its client is slow). They wait here, on the loop,
        # instead of blocking the worker's reader thread (and so every other invocation on the
        # worker); credits are held back meanwhile, so this holds at most `credits` writes.
        self.backlog: list[str] | None = None
        self.deferred: tuple[str, Any] | None = None  # the outcome, held until the backlog is in
        # Its worker slot goes back once: when the outcome arrives (`release_early`: the next
        # invocation starts on the worker before this one's task even wakes), else when it ends.
        self.released = False
        self.release_early = False

    def settle(self, outcome: tuple[str, Any]) -> None:
        """On the loop: the first outcome wins."""
        _resolve(self.future, outcome)
        _resolve(self.waiter, outcome)

    def finish(self, outcome: tuple[str, Any]) -> None:
        """Resolve from any thread; the first outcome wins."""
        call_threadsafe(self.loop, self.settle, outcome)


class WorkerProcess:
    """One worker: its process, its socket, its slots and the thread that reads it."""

    def __init__(self, pool: PoolSide) -> None:
        self.pool = pool
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = pool.launch(child_sock)
        finally:
            child_sock.close()
        self.pid = self.proc.pid
        release_in_forked_children(parent_sock.fileno())  # a handler's fork must not keep the worker waiting
        self.conn: Connection[ToWorker, ToFrontend] = Connection(parent_sock)
        self.state: State = "starting"
        self.ready = False
        self.invocations = 0
        self.started = time.time()
        self.jobs: dict[str, PooledCall] = {}
        self.busy = 0                      # slots taken (an acquired slot may not have its job yet)
        self.idle_since = time.monotonic()
        self.sessions: dict[str, Session] = {}  # sessions pinned here (a worker with live ones stays up)
        self.exclusive: Session | None = None    # a session with concurrency -1 owns this worker
        self.kill_reason: str | None = None
        self.exited = threading.Event()
        self.returncode: int | None = None
        self.streams = StreamBridge(self.send, pool.spec.tenant)
        self._batch: list[bytes] = []  # frames queued on the loop this turn (send_on_loop)
        self._inbox: list[tuple[PooledCall, Write | Item | Result | Error]] = []  # invocation frames for the loop
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
            grace = self.pool.pre_stop_grace
        self.send({"t": "stop"} if grace is None else {"t": "stop", "grace": grace})

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
            forget(self.conn.sock.fileno())
            self.conn.close()
            self.streams.release()
            self.exited.set()
            self.pool._on_exit(self)

    def _handle(self, msg: ToFrontend) -> None:
        if msg["t"] == "write" or msg["t"] == "item" or msg["t"] == "result" or msg["t"] == "error":
            if (msg["t"] == "error" or msg["t"] == "result") and msg.get("retire"):
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
        elif msg["t"] == "progress":
            # For the job whose event the frontend sent this invocation (never an id the worker names)
            progressed = self.jobs.get(msg["id"])
            event = progressed.inv.event if progressed is not None else None
            if isinstance(event, dict) and isinstance(event.get("id"), str):
                report_progress(event["id"], msg["v"])
        elif msg["t"] == "loaded":
            self.pool._on_loaded(msg.get("kind"), msg.get("error"), msg.get("runpod"))
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
        """On the loop: deliver the invocation frames the reader thread queued, then their credits
        — none for an invocation whose outcome came in the same batch: the worker is done with it
        (a short stream's writes and result arrive together; a credit frame would only wake it)."""
        with self._inbox_lock:
            frames, self._inbox = self._inbox, []
        ended = {job for job, msg in frames if msg["t"] == "result" or msg["t"] == "error"}
        for job, msg in frames:
            if msg["t"] == "write":
                self._deliver(job, msg["p"], job not in ended)
            elif msg["t"] == "item":
                if job.inv.streaming:  # a job's generator items: values into the channel, as in-process
                    self._deliver(job, [OutputItem.of(value) for value in msg["v"]], job not in ended)
                else:
                    self._aggregate(job, msg["v"], job not in ended)
            elif msg["t"] == "result":
                self._finish(job, ("result", json.loads(msg["json"])))
            else:
                self._finish(job, ("error", job.error or error_from_wire(msg["error"], msg["message"])))

    def _finish(self, job: PooledCall, outcome: tuple[str, Any]) -> None:
        if job.backlog is not None:
            job.deferred = outcome  # its last writes are still on their way into the channel
            return
        self._outcome(job, outcome)

    def _outcome(self, job: PooledCall, outcome: tuple[str, Any]) -> None:
        """On the loop: the worker is done with the invocation; its slot may serve the next one now."""
        job.settle(outcome)
        if job.release_early:
            self.pool.release(self, job)

    def _credit(self, job: PooledCall, n: int) -> None:
        self.send_on_loop({"t": "credit", "id": job.inv.id, "n": n})  # small: always queued

    def _deliver(self, job: PooledCall, payloads: list[str], credit: bool = True) -> None:
        """On the loop: put a (coalesced) write frame into the invocation's channel, give the
        credits back (`credit`). What does not fit waits in the job's backlog (credits held back)."""
        if job.backlog is not None:
            job.backlog.extend(payloads)
            return
        inv = job.inv
        try:
            count = inv.channel.try_put_many(payloads)
        except StreamClosedError as exc:
            self.cancel(inv.id, exc.message)  # the client left or the deadline passed
            return
        if count < len(payloads):
            job.backlog = payloads[count:]
            job.loop.create_task(self._drain(job), name=f"backlog-{inv.id}")
        if count and credit:
            self._credit(job, count)

    async def _drain(self, job: PooledCall) -> None:
        """Move the backlog into the channel as the client reads: whatever fits at once, its
        credits in one frame (a write at a time, a credit frame each, cost every write of a fast
        stream that outran its channel)."""
        inv = job.inv
        backlog = job.backlog
        while backlog:
            try:
                count = inv.channel.try_put_many(backlog)
                if not count:
                    await inv.channel.put(backlog[0])  # waits for room (the client reads)
                    count = 1
            except StreamClosedError as exc:
                self.cancel(inv.id, exc.message)  # the client left: what is left here is discarded
                backlog.clear()
                break
            del backlog[:count]
            self._credit(job, count)
        job.backlog = None
        outcome, job.deferred = job.deferred, None
        if outcome is not None:
            self._outcome(job, outcome)

    def _aggregate(self, job: PooledCall, items: list[Any], credit: bool = True) -> None:
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
        if credit:
            self._credit(job, len(items))
