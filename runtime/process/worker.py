"""A runtime worker process: loads one function's code, then runs its invocations one at a time.

Started by the frontend as `python -m runtime.process.worker FD` (a fresh interpreter, never a
fork of the event-loop process), it talks over the Unix socket FD (see `protocol`). The handler
runs on the main thread so it can be interrupted: a cancel frame makes the reader thread send
SIGUSR1 to the main thread, whose handler raises inside the user's code (even in `time.sleep`).
A handler that ignores that is killed by the frontend after a grace period.
"""
from __future__ import annotations

import asyncio
import faulthandler
import inspect
import json
import logging
import os
import queue
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from ..context import Context
from ..deployment import handler_kind
from ..errors import FunctionServiceError, StreamClosedError, handler_failure
from ..invocation import WRITTEN, Written, drain_generator, encode_json, encode_payload, encode_write
from ..loader import load_code
from ..manifest import FunctionSpec
from ..pre_stop import pre_stop_timeout
from ..streams import bind_broker
from ..surface import Mode
from .errors import MemoryLimitError
from .protocol import (
    Connection,
    ConnectionClosed,
    Invoke,
    Item,
    ProtocolError,
    Stop,
    StreamReply,
    ToFrontend,
    ToWorker,
    Write,
)
from .streams_bridge import ProxyBroker, stream_error

__all__ = ("Worker", "main")

log = logging.getLogger("fnstream.worker")


class _Cancelled(BaseException):
    """Raised inside the handler when the frontend cancels the invocation (client gone)."""




class _Invocation:
    """The invocation inside the worker: what `Context` needs (satisfies HandlerInvocation)."""

    def __init__(self, msg: Invoke, worker: Worker) -> None:
        self.id: str = msg["id"]
        self.trace_id: str = msg["trace_id"]
        self.event = msg["event"]
        self.streaming: bool = msg["streaming"]
        self.mode: Mode = "sse" if self.streaming else "json"  # raw framing is the frontend's concern
        self._worker = worker
        self.started = time.monotonic()
        self.deadline = self.started + float(msg["timeout"])
        self.max_write_size: int = msg["max_write_size"]
        self.cancel_reason: str | None = None
        self.stream = WorkerStream(self, worker)

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def cancel(self, reason: str) -> None:
        self._worker._cancel(self.id, reason)


class WorkerStream:
    """`context.get_stream()` in a worker: same contract as the in-process StreamWriter.

    A write blocks while the worker has no credit left, i.e. while the frontend has not yet put
    the earlier writes into the invocation's bounded channel (the client is slow).
    """

    __slots__ = ("_inv", "_worker", "max_write_size")

    def __init__(self, inv: _Invocation, worker: Worker) -> None:
        self._inv = inv
        self._worker = worker
        self.max_write_size = inv.max_write_size

    def set_max_write_size(self, size: int) -> None:
        self.max_write_size = int(size)

    def write(self, data: Any) -> Written:
        payload = encode_write(data, self.max_write_size)
        if not self._inv.streaming:
            if self._inv.cancel_reason is not None:
                raise StreamClosedError(f"stream closed: {self._inv.cancel_reason}")
            return WRITTEN  # a plain JSON request has no stream; writes are dropped as in-process
        self._worker.send_output(self._inv, {"t": "write", "id": self._inv.id, "p": payload})
        return WRITTEN


class _FrameLogHandler(logging.Handler):
    """Forwards the worker's log records to the frontend's logging."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(logging.INFO)
        self._worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._worker.post({"t": "log", "name": record.name, "level": record.levelno, "msg": self.format(record)})
        except Exception:
            self.handleError(record)


class Worker:
    """The worker's state: the loaded code, the current invocation and its write credits."""

    def __init__(self, conn: Connection[ToFrontend, ToWorker], spec: FunctionSpec, code_roots: list[Path],
                 credits: int) -> None:
        self.conn = conn
        self.spec = spec
        self.code_roots = code_roots
        self.max_credits = credits
        self._code: Any = None
        self._inbox: queue.Queue[Invoke | Stop] = queue.Queue()
        self._cond = threading.Condition()
        self._inv: _Invocation | None = None
        self._credits = 0
        self._early_cancel: tuple[str, str] | None = None
        self._cancellable = False
        self._main_ident = threading.get_ident()
        self._stream_replies: dict[int, StreamReply] = {}
        self._stream_seq = 0
        # Frames from the main thread go through a bounded outbox and a writer thread: the cancel
        # signal raises at any bytecode of the main thread and must never cut a frame in half.
        self._outbox: queue.Queue[ToFrontend] = queue.Queue(maxsize=64)
        # Named streams: the API runs on this loop (in its own thread) for sync handlers, and on
        # the handler's own loop for async ones; either way every broker call goes to the frontend.
        self.streams = ProxyBroker(self.stream_call)
        self._streams_loop = asyncio.new_event_loop()

    def post(self, frame: ToFrontend) -> None:
        self._outbox.put(frame)

    def flush(self) -> None:
        self._outbox.join()

    def flush_before_exit(self, timeout: float = 2.0) -> None:
        """Let the writer thread send what is queued (a handler's last writes) before the process
        dies by `os._exit`; bounded, since the frontend may be gone. Death by a signal cannot flush."""
        if threading.current_thread().name == "fnstream-worker-writer":
            return  # the writer itself is exiting (the frontend is gone): nothing can be sent
        deadline = time.monotonic() + timeout
        while self._outbox.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def _write_loop(self) -> None:
        while True:
            frame = self._outbox.get()
            try:
                self.conn.send(frame)
            except ConnectionClosed:
                os._exit(0)  # the frontend is gone
            except (ProtocolError, TypeError, ValueError) as exc:
                sys.stderr.write(f"fnstream worker: dropped a {frame.get('t')!r} frame: {exc}\n")
            finally:
                self._outbox.task_done()

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> str | None:
        """Load the code and run the initializer; returns the error that makes invocations fail.

        The `loaded` frame tells the frontend the import worked (and the handler's kind) before a
        possibly long initializer runs: a deploy waits for it, never for the initializer.
        """
        try:
            self._code = load_code(self.spec, self.code_roots)
        except FunctionServiceError as exc:
            self.post({"t": "loaded", "kind": None, "error": exc.message})
            return exc.message
        self.post({"t": "loaded", "kind": handler_kind(self._code.handler), "error": None})
        init = self._code.initializer
        if init is None:
            return None
        try:
            result = init(Context(self.spec))
            if inspect.iscoroutine(result):
                asyncio.run(result)
        except Exception as exc:
            log.error("initializer failed:\n%s", traceback.format_exc())
            return f"initializer failed: {type(exc).__name__}: {exc}"
        return None

    def serve(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_cancel_signal)
        threading.Thread(target=self._write_loop, name="fnstream-worker-writer", daemon=True).start()
        threading.Thread(target=self._streams_loop.run_forever, name="fnstream-worker-streams", daemon=True).start()
        bind_broker(self.streams, self._streams_loop)
        # The reader runs before the initializer, which may use named streams (their replies).
        threading.Thread(target=self._read_loop, name="fnstream-worker-reader", daemon=True).start()
        init_error = self.start()
        self.post({"t": "ready", "pid": os.getpid(), "init_error": init_error})
        while True:
            msg = self._inbox.get()
            if msg["t"] == "stop":
                self._stop()
                return
            if not self._run(msg):
                return

    # -- reader thread -------------------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (ConnectionClosed, ProtocolError):
                os._exit(0)  # the frontend is gone: nobody can use this worker any more
            if msg["t"] == "invoke" or msg["t"] == "stop":
                self._inbox.put(msg)
            elif msg["t"] == "credit":
                with self._cond:
                    if self._inv is not None and self._inv.id == msg["id"]:
                        self._credits += int(msg["n"])
                        self._cond.notify_all()
            elif msg["t"] == "cancel":
                self._cancel(msg["id"], msg["reason"])
            elif msg["t"] == "stream_reply":
                with self._cond:
                    self._stream_replies[msg["seq"]] = msg
                    self._cond.notify_all()

    def _cancel(self, inv_id: str, reason: str) -> None:
        with self._cond:
            inv = self._inv
            if inv is None or inv.id != inv_id:
                self._early_cancel = (inv_id, reason)  # the invoke frame is still in the inbox
                return
            inv.cancel_reason = reason
            self._cond.notify_all()
        signal.pthread_kill(self._main_ident, signal.SIGUSR1)

    def _on_cancel_signal(self, signum: int, frame: Any) -> None:
        inv = self._inv
        if self._cancellable and inv is not None and inv.cancel_reason is not None:
            raise _Cancelled(inv.cancel_reason)

    # -- output --------------------------------------------------------------------------------
    def send_output(self, inv: _Invocation, frame: Write | Item) -> None:
        """Send a write or item once a credit is available (backpressure from the client)."""
        with self._cond:
            while True:
                if inv.cancel_reason is not None:
                    raise StreamClosedError(f"stream closed: {inv.cancel_reason}")
                if self._credits > 0:
                    self._credits -= 1
                    break
                if not self._cond.wait(timeout=max(inv.remaining(), 0.001)) and inv.remaining() <= 0:
                    raise StreamClosedError("stream write timed out: the client is not reading")
        self.post(frame)

    def _add_item(self, inv: _Invocation, item: Any) -> None:
        if inv.streaming:
            inv.stream.write(item)
            return
        payload = encode_payload(item)
        value = payload if isinstance(item, (str, bytes, bytearray, memoryview)) else json.loads(payload)
        self.send_output(inv, {"t": "item", "id": inv.id, "v": value})

    # -- invocations ---------------------------------------------------------------------------
    def _call(self, inv: _Invocation, ctx: Context) -> Any:
        handler = self._code.handler
        if inspect.isasyncgenfunction(handler):
            async def drain() -> None:
                async for item in handler(inv.event, ctx):
                    self._add_item(inv, item)
            asyncio.run(self._on_own_loop(drain()))
            return None
        result = handler(inv.event, ctx)
        if inspect.iscoroutine(result):
            return asyncio.run(self._on_own_loop(result))
        if inspect.isgenerator(result):
            return drain_generator(result, lambda item: self._add_item(inv, item))
        return result

    async def _on_own_loop(self, coro: Any) -> Any:
        """Run an async handler with the stream API bound to its loop (asyncio objects are per loop)."""
        bind_broker(self.streams, asyncio.get_running_loop())
        try:
            return await coro
        finally:
            bind_broker(self.streams, self._streams_loop)

    def _run(self, msg: Invoke) -> bool:
        """Run one invocation and report its outcome; False when this worker must exit."""
        inv = _Invocation(msg, self)
        with self._cond:
            self._inv = inv
            self._credits = self.max_credits
            if self._early_cancel is not None and self._early_cancel[0] == inv.id:
                inv.cancel_reason = self._early_cancel[1]
            self._early_cancel = None
        retire = False
        try:
            try:
                self._cancellable = True
                if inv.cancel_reason is not None:
                    raise _Cancelled(inv.cancel_reason)
                result = self._call(inv, Context(self.spec, inv))
            finally:
                self._cancellable = False
            text = encode_json(result)
            self.post({"t": "result", "id": inv.id, "json": text})
            return True
        except _Cancelled as exc:
            outcome: tuple[str, str] = ("StreamClosedError", f"stream closed: {exc}")
        except FunctionServiceError as exc:
            outcome = (type(exc).__name__, exc.message)
        except MemoryError:
            # The heap may be in any state now: report, then let the frontend start a fresh worker.
            outcome, retire = (MemoryLimitError.__name__,
                               f"function {self.spec.name!r} exceeded its memory limit of {self.spec.memory} MB"), True
        except SystemExit as exc:
            outcome = ("HandlerError", handler_failure(exc).message)
        except BaseException as exc:
            log.error("invocation %s raised:\n%s", inv.id, "".join(traceback.format_exception(exc)))
            outcome = ("HandlerError", handler_failure(exc).message)
        finally:
            with self._cond:
                self._inv = None
                self._stream_replies.clear()  # answers to calls a cancelled handler gave up on
        self.post({"t": "error", "id": inv.id, "error": outcome[0], "message": outcome[1], "retire": retire})
        if retire:
            self.flush()
        return not retire

    # -- named streams -------------------------------------------------------------------------
    def stream_call(self, op: str, *args: Any) -> Any:
        """Run a named-stream operation in the frontend and wait for its answer."""
        with self._cond:
            self._stream_seq += 1
            seq = self._stream_seq
        self.post({"t": "stream_call", "seq": seq, "op": op, "args": list(args)})
        with self._cond:
            while seq not in self._stream_replies:
                self._cond.wait()
            reply = self._stream_replies.pop(seq)
        if "error" in reply:
            raise stream_error(reply["error"], reply["message"])
        return reply.get("value")

    # -- stop ----------------------------------------------------------------------------------
    def _stop(self) -> None:
        """Run preStop, then report; the worker exits after this whether or not preStop finished."""
        pre_stop = self._code.pre_stop if self._code is not None else None
        error = self._run_pre_stop(pre_stop) if pre_stop is not None else None
        self.post({"t": "stopped", "error": error})
        self.flush()

    def _run_pre_stop(self, pre_stop: Any) -> str | None:
        """preStop within min(timeout, 180 s), as for in-process functions (runtime/pre_stop.py).

        It runs in a daemon thread, so one that hangs is left behind when the worker exits.
        """
        timeout = pre_stop_timeout(self.spec)
        errors: list[str | None] = []

        def run() -> None:
            try:
                result = pre_stop(Context(self.spec))
                if inspect.iscoroutine(result):
                    asyncio.run(result)
            except BaseException as exc:
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


def _limit_memory(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < limit:
        limit = hard
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the frontend decides
    faulthandler.enable()  # a segfault prints the Python stack to the server's stderr
    conn: Connection[ToFrontend, ToWorker] = Connection(socket.socket(fileno=int(args[0])))
    hello = conn.recv()
    if hello["t"] != "hello":
        raise ProtocolError(f"the first frame must be 'hello', not {hello['t']!r}")
    spec = FunctionSpec.model_validate(hello["spec"])
    _limit_memory(spec.memory)
    worker = Worker(conn, spec, [Path(p) for p in hello["code_roots"]], int(hello["credits"]))
    real_exit = os._exit

    def exit_after_flush(status: int) -> NoReturn:  # a handler calling os._exit: its writes still go out
        worker.flush_before_exit()
        real_exit(status)

    os._exit = exit_after_flush
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(_FrameLogHandler(worker))
    worker.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
