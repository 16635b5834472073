"""The worker's main loop: loads one function's code, then runs up to `slots` invocations at once.

Run in a fresh interpreter (never a fork of the event-loop process) by runtime/process/worker.py,
it talks over the Unix socket FD (see `protocol`). The main thread runs the worker's own event
loop: `async def` and async-generator handlers run on it as tasks, concurrently; plain `def` and
generator handlers run in a thread pool of `slots` threads. A cancel (client gone, session
interrupt, timeout) cancels an async handler's task, and raises inside a `def` handler's thread at
its next Python bytecode; a handler that still does not stop is killed with its worker by the
frontend after a grace period. Output: child/outbox.py; credits and streams: child/flow.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import faulthandler
import inspect
import logging
import os
import resource
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ...codec import encode_json
from ...context import Context
from ...deployment import Kind, handler_kind
from ...errors import FunctionServiceError, ResultNotSerializableError, handler_failure
from ...fork_guard import become_subreaper, end_descendants, release_in_forked_children
from ...heap import freeze_startup
from ...invocation import drain_generator
from ...loader import LoadedCode, load_code
from ...logs import set_log_context
from ...manifest import FunctionSpec
from ...pre_stop import pre_stop_timeout
from ...runpod_compat import set_progress_sink
from ...streams import bind_broker
from ...threadpool import DaemonThreadPool
from ..errors import MemoryLimitError
from ..instances import instance_slots, with_runpod_concurrency
from ..protocol import (
    Cancel,
    Connection,
    ConnectionClosed,
    Invoke,
    ProtocolError,
    Stop,
    StreamReply,
    ToFrontend,
    ToWorker,
)
from ..streams_bridge import ProxyBroker, stream_error
from .flow import Cancelled, FlowControl, WorkerInvocation, raise_in_thread, resolve
from .outbox import FrameLogHandler, Outbox, hard_exit

__all__ = ("ChildProgram", "main")

log = logging.getLogger("fnstream.worker")


class ChildProgram(FlowControl):
    """The worker's state: the loaded code, its running invocations, the outbox."""

    def __init__(self, conn: Connection[ToFrontend, ToWorker], spec: FunctionSpec, code_roots: list[Path],
                 credits: int) -> None:
        self.conn = conn
        self.spec = spec
        self.code_roots = code_roots
        self.max_credits = credits
        self._code: LoadedCode | None = None
        self.kind: Kind = "sync"
        self.slots = 1
        # One lock for the invocations' state; writes take it directly (a Condition's `with` is a
        # Python-level call on every write), waits go through the Condition over it.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._invs: dict[str, WorkerInvocation] = {}
        self._early_cancels: dict[str, str] = {}  # a cancel that overtook its invoke frame
        self._threads: DaemonThreadPool | None = None
        self._retiring = False
        self._stop_requested = False
        self._stream_replies: dict[int, StreamReply] = {}
        self._stream_waiters: dict[int, asyncio.Future[StreamReply]] = {}
        self._stream_seq = 0
        self.outbox = Outbox(conn)
        self.post = self.outbox.post  # bound once: called per frame
        self.post_write = self.outbox.post_write
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.get_ident()  # serve() runs the loop on this (the main) thread
        self._done = asyncio.Event()
        # Named streams: every broker call goes to the frontend; the API runs on this worker's loop.
        self.streams = ProxyBroker(self.stream_call, self.astream_call, self.stream_post)

    # -- start ---------------------------------------------------------------------------------
    def load(self) -> str | None:
        """Import the code (on the main thread); the error that fails the deploy, if any.

        The `loaded` frame tells the frontend the import worked (and the handler's kind) before a
        possibly long initializer runs: a deploy waits for it, never for the initializer.
        """
        try:
            self._code = load_code(self.spec, self.code_roots)
        except FunctionServiceError as exc:
            self.post({"t": "loaded", "kind": None, "error": exc.message})
            return exc.message
        self.kind = handler_kind(self._code.handler)
        options = self._code.runpod
        self.spec = with_runpod_concurrency(self.spec, options.concurrency if options else None)
        self.slots = instance_slots(self.spec, self.kind)
        if self.kind in ("sync", "gen"):
            self._threads = DaemonThreadPool(self.slots, thread_name_prefix="fnstream-handler")
        runpod = None if options is None else {"concurrency": options.concurrency,
                                               "aggregate_stream": options.aggregate_stream}
        if options is not None:
            set_progress_sink(self._progress)
        self.post({"t": "loaded", "kind": self.kind, "error": None, "runpod": runpod})
        return None

    async def _initialize(self) -> str | None:
        init = self._code.initializer if self._code is not None else None
        if init is None:
            return None
        try:
            if inspect.iscoroutinefunction(init):
                await init(Context(self.spec))
            else:
                result = await asyncio.to_thread(init, Context(self.spec))
                if inspect.iscoroutine(result):
                    await result
        except Exception as exc:  # user code
            log.error("initializer failed:\n%s", traceback.format_exc())
            return f"initializer failed: {type(exc).__name__}: {exc}"
        return None

    def serve(self) -> None:
        threading.Thread(target=self.outbox.write_loop, name="fnstream-worker-writer", daemon=True).start()
        asyncio.set_event_loop(self.loop)
        bind_broker(self.streams, self.loop)
        # The reader runs before the initializer, which may use named streams (their replies).
        threading.Thread(target=self._read_loop, name="fnstream-worker-reader", daemon=True).start()
        load_error = self.load()
        self.loop.run_until_complete(self._serve(load_error))

    async def _serve(self, load_error: str | None) -> None:
        init_error = load_error or await self._initialize()
        # Its code and what the initializer loaded: walked by no later collection (runtime/heap.py).
        freeze_startup(collect=False, rarer_full=False)
        self.post({"t": "ready", "pid": os.getpid(), "init_error": init_error})
        await self._done.wait()

    # -- reader thread -------------------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (ConnectionClosed, ProtocolError):
                hard_exit(0)  # the frontend is gone: nobody can use this worker any more
            if msg["t"] == "credit":
                self._on_credit(msg["id"], int(msg["n"]))
            elif msg["t"] == "stream_reply":
                self._on_stream_reply(msg)
            elif msg["t"] == "hello":
                continue  # only the first frame is a hello (main reads it)
            elif msg["t"] != "stop" and self._threads is not None:
                self._on_command(msg)  # def handlers: straight to the thread pool, no hop through the loop
            else:
                self.loop.call_soon_threadsafe(self._on_command, msg)

    def _on_command(self, msg: Invoke | Cancel | Stop) -> None:
        if msg["t"] == "invoke":
            self._start(msg)
        elif msg["t"] == "cancel":
            self._cancel(msg["id"], msg["reason"])
        else:
            self._stop_requested = True
            self.loop.create_task(self._stop(msg.get("grace")))

    def _cancel(self, inv_id: str, reason: str) -> None:
        with self._cond:
            inv = self._invs.get(inv_id)
            if inv is None:
                if len(self._early_cancels) < 1024:
                    self._early_cancels[inv_id] = reason  # its invoke frame is still on its way
                return
            if inv.cancel_reason is None:
                inv.cancel_reason = reason
            self._cond.notify_all()
            if inv.thread is not None and inv.cancellable and not inv.interrupted:
                inv.interrupted = True
                raise_in_thread(inv.thread, Cancelled)
        if inv.credit_waiter is not None:
            resolve(inv.credit_waiter, None)
        if inv.task is not None:
            inv.task.cancel(reason)

    # -- invocations ---------------------------------------------------------------------------
    def _start(self, msg: Invoke) -> None:
        inv = WorkerInvocation(msg, self)
        with self._cond:
            self._invs[inv.id] = inv
            inv.cancel_reason = self._early_cancels.pop(inv.id, None)
        if self._threads is None:
            inv.task = self.loop.create_task(self._run_async(inv))  # a task: its own copy of the log context
        else:
            self._threads.call(contextvars.copy_context().run, self._run_in_thread, inv)

    async def _run_async(self, inv: WorkerInvocation) -> None:
        assert self._code is not None
        handler = self._code.handler
        set_log_context(inv.trace_id, self.spec.name, inv.id)
        try:
            if inv.cancel_reason is not None:
                raise Cancelled(inv.cancel_reason)
            ctx = Context(self.spec, inv)
            if self.kind == "asyncgen":
                async with contextlib.aclosing(handler(inv.event, ctx)) as items:
                    async for item in items:
                        await self._item(inv, item)
                result = None
            else:
                result = await handler(inv.event, ctx)
                await inv.stream.flush()  # a last write the handler did not await must not be lost
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if inv.cancel_reason is not None:
                self._report(inv, None, Cancelled(inv.cancel_reason))
            else:  # the handler's own code let a CancelledError escape: a handler failure
                self._report(inv, None, exc)
        except BaseException as exc:  # classified in _report
            self._report(inv, None, exc)
        else:
            self._report(inv, result, None)

    def _run_in_thread(self, inv: WorkerInvocation) -> None:
        assert self._code is not None
        handler = self._code.handler
        result: Any = None
        error: BaseException | None = None
        set_log_context(inv.trace_id, self.spec.name, inv.id)  # in this invocation's copy of the context
        try:
            try:
                with self._cond:
                    inv.thread = threading.get_ident()
                    inv.cancellable = True
                    if inv.cancel_reason is not None:
                        raise Cancelled(inv.cancel_reason)
                ctx = Context(self.spec, inv)
                result = handler(inv.event, ctx)
                if inspect.isgenerator(result):
                    result = drain_generator(result, lambda item: self._item_blocking(inv, item))
            finally:
                with self._cond:
                    inv.cancellable = False
                    if inv.interrupted:
                        raise_in_thread(threading.get_ident(), None)  # not raised yet: withdraw it
        except BaseException as exc:  # classified in _report, including our Cancelled
            error = exc
        self._report(inv, result, error)

    def _progress(self, job_id: str, value: Any) -> bool:
        """runpod.serverless.progress_update() of a job running here: to the frontend, by invocation."""
        with self._cond:
            inv = next((i for i in self._invs.values()
                        if isinstance(i.event, dict) and i.event.get("id") == job_id), None)
        if inv is not None:
            self.post({"t": "progress", "id": inv.id, "v": value})
        return inv is not None

    def _report(self, inv: WorkerInvocation, result: Any, exc: BaseException | None) -> None:
        """Send the invocation's outcome (from its task or its thread) and forget it."""
        retire = False
        if exc is None:
            try:
                text = encode_json(result)
            except ResultNotSerializableError as err:
                exc = err
            else:
                # RunPod's refresh_worker (start() option, or a returned dict's key): a fresh worker
                # next; for a job only (`items`: a job's), as runpod-python's worker loop, never a plain invoke
                options = self._code.runpod if self._code is not None else None
                retire = inv.items and options is not None and (options.refresh_worker or (
                    isinstance(result, dict) and bool(result.get("refresh_worker"))))
                self.outbox.post_outcome({"t": "result", "id": inv.id, "json": text, "retire": retire})
        if exc is not None:
            name, message, retire = self._classify(inv, exc)
            self.outbox.post_outcome({"t": "error", "id": inv.id, "error": name, "message": message, "retire": retire})
        with self._cond:
            self._invs.pop(inv.id, None)
            if retire:
                self._retiring = True
            leave = self._retiring and not self._invs
        if leave:
            self.loop.call_soon_threadsafe(self._done.set)

    def _classify(self, inv: WorkerInvocation, exc: BaseException) -> tuple[str, str, bool]:
        if isinstance(exc, Cancelled):
            return "StreamClosedError", f"stream closed: {inv.cancel_reason or exc}", False
        if isinstance(exc, FunctionServiceError):
            return type(exc).__name__, exc.message, False
        if isinstance(exc, MemoryError):
            # The heap may be in any state now: report, let the others finish, then make way for a fresh worker.
            return (MemoryLimitError.__name__,
                    f"function {self.spec.name!r} exceeded its memory limit of {self.spec.memory} MB", True)
        if not isinstance(exc, SystemExit):
            log.error("invocation %s raised:\n%s", inv.id, "".join(traceback.format_exception(exc)))
        return "HandlerError", handler_failure(exc).message, False

    # -- named streams -------------------------------------------------------------------------
    def _next_seq(self) -> int:
        with self._cond:
            self._stream_seq += 1
            return self._stream_seq

    def stream_call(self, op: str, *args: Any) -> Any:
        """Run a named-stream operation in the frontend and wait for its answer (blocking)."""
        seq = self._next_seq()
        self.post({"t": "stream_call", "seq": seq, "op": op, "args": list(args)})
        with self._cond:
            while seq not in self._stream_replies:
                self._cond.wait()
            reply = self._stream_replies.pop(seq)
        return _stream_value(reply)

    async def astream_call(self, op: str, *args: Any) -> Any:
        """`stream_call` awaited on the worker's loop (no thread held while the frontend answers)."""
        seq = self._next_seq()
        waiter: asyncio.Future[StreamReply] = self.loop.create_future()
        with self._cond:
            self._stream_waiters[seq] = waiter
        self.post({"t": "stream_call", "seq": seq, "op": op, "args": list(args)})
        try:
            reply = await waiter
        finally:
            with self._cond:
                self._stream_waiters.pop(seq, None)
        return _stream_value(reply)

    def stream_post(self, op: str, *args: Any) -> None:
        """A stream operation whose answer nobody waits for (seq 0 replies are dropped)."""
        self.post({"t": "stream_call", "seq": 0, "op": op, "args": list(args)})

    def _on_stream_reply(self, msg: StreamReply) -> None:
        seq = msg["seq"]
        with self._cond:
            waiter = self._stream_waiters.pop(seq, None)
            if waiter is None and seq:
                self._stream_replies[seq] = msg
                self._cond.notify_all()
        if waiter is not None:
            self.loop.call_soon_threadsafe(resolve, waiter, msg)

    # -- stop ----------------------------------------------------------------------------------
    async def _stop(self, grace: float | None) -> None:
        """Run preStop, then report; the worker exits after this whether or not preStop finished."""
        pre_stop = self._code.pre_stop if self._code is not None else None
        error = await asyncio.to_thread(self._run_pre_stop, pre_stop, grace) if pre_stop is not None else None
        self.post({"t": "stopped", "error": error})
        self._done.set()

    def _run_pre_stop(self, pre_stop: Callable[..., Any], grace: float | None) -> str | None:
        """preStop within min(timeout, 180 s, `grace`), as for in-process functions (runtime/pre_stop.py).

        It runs in a daemon thread, so one that hangs is left behind when the worker exits.
        """
        timeout = pre_stop_timeout(self.spec, grace)
        errors: list[str | None] = []

        def run() -> None:
            try:
                result = pre_stop(Context(self.spec))
                if inspect.iscoroutine(result):
                    asyncio.run_coroutine_threadsafe(result, self.loop).result()
            except BaseException as exc:  # user code, including sys.exit
                log.error("preStop failed:\n%s", traceback.format_exc())
                errors.append(f"preStop failed: {type(exc).__name__}: {exc}")
            else:
                errors.append(None)

        thread = threading.Thread(target=run, name="fnstream-worker-prestop", daemon=True)
        thread.start()
        thread.join(timeout)
        if not errors:
            return f"preStop did not finish within {timeout:g} s; the worker exits without it"
        return errors[0]


def _stream_value(reply: StreamReply) -> Any:
    if "error" in reply:
        raise stream_error(reply["error"], reply["message"])
    return reply.get("value")



def _limit_memory(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < limit:
        limit = hard
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the frontend decides
    faulthandler.enable()  # a segfault prints the Python stack to the server's stderr
    fd = int(args[0])
    become_subreaper()  # a handler's detached grandchild stays ours, and ends with us (fork_guard)
    os.set_inheritable(fd, False)  # passed to us inheritable: a handler's subprocess must not get it
    release_in_forked_children(fd)  # nor a handler's fork (the server would never see us end)
    conn: Connection[ToFrontend, ToWorker] = Connection(socket.socket(fileno=fd))
    hello = conn.recv()
    if hello["t"] != "hello":
        raise ProtocolError(f"the first frame must be 'hello', not {hello['t']!r}")
    spec = FunctionSpec.model_validate(hello["spec"])
    _limit_memory(spec.memory)
    worker = ChildProgram(conn, spec, [Path(p) for p in hello["code_roots"]], int(hello["credits"]))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(FrameLogHandler(worker.post))

    me = os.getpid()

    def exit_after_flush(code: int) -> NoReturn:
        """A handler's os._exit: what it wrote before still reaches the client. (In a process the
        handler forked, os._exit is its own: nothing of the worker's to flush or end there.)"""
        if os.getpid() == me:
            worker.outbox.flush()
            end_descendants()
        hard_exit(code)
    os._exit = exit_after_flush  # type: ignore[assignment]
    worker.serve()
    end_descendants()  # what its handlers started and left running ends with the worker
    worker.outbox.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    hard_exit(0)
