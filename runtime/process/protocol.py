"""The frontend <-> worker wire protocol: length-prefixed msgpack frames over a Unix socket.

A frame is a 4-byte big-endian length followed by one msgpack map whose `t` field names the
message. Both ends use blocking sockets from threads (the frontend reads each worker from a
dedicated thread, the worker has a reader and a writer thread), so `Connection` is deliberately
simple; `try_send` lets the event loop send a small frame without a thread hop, and `send_many`
puts every frame that queued up meanwhile into one system call.
Backpressure is credit-based: each invocation may have at most `credits` stream writes
unacknowledged; the frontend returns one credit per write once it is in the invocation's channel.
"""
from __future__ import annotations

import socket
import struct
import threading
from typing import Any, Generic, Literal, NotRequired, TypedDict, TypeVar, cast, get_args, get_type_hints

import msgpack

__all__ = (
    "DEFAULT_CREDITS",
    "MAX_FRAME",
    "TAGS",
    "Cancel",
    "Connection",
    "ConnectionClosed",
    "Credit",
    "Error",
    "Frame",
    "Hello",
    "Invoke",
    "Item",
    "Loaded",
    "Log",
    "Progress",
    "ProtocolError",
    "Ready",
    "Result",
    "Stop",
    "Stopped",
    "StreamCall",
    "StreamReply",
    "ToFrontend",
    "ToWorker",
    "Write",
)

_HEADER = struct.Struct(">I")
# Bigger than any event (maxRequestBodySize) or write (maxWriteSize) fnstream accepts.
MAX_FRAME = 64 * 1024 * 1024
DEFAULT_CREDITS = 256
# What one read asks of the socket. Under glibc's mmap threshold (128 KiB): a larger buffer was
# mmap'd, shrunk and unmapped around every read (three system calls a frame, in the worker too).
READ_CHUNK = 64 * 1024
TRY_SEND_MAX = 64 * 1024  # frames up to this size may be sent straight from the event loop


# -- frontend -> worker ------------------------------------------------------------------------
class Hello(TypedDict):
    t: Literal["hello"]
    spec: dict[str, Any]  # FunctionSpec.model_dump(mode="json")
    code_roots: list[str]
    credits: int


class Invoke(TypedDict):
    t: Literal["invoke"]
    id: str
    trace_id: str
    event: Any
    streaming: bool
    timeout: float         # seconds left when the frontend sent it
    max_write_size: int
    session_id: str | None       # X-Instance-Session's sessionID, if any
    session_restarted: bool      # the session's earlier instance died: its in-memory state is gone
    items: bool            # streaming, its generator items are sent as `item` frames (values: a job's output)


class Credit(TypedDict):
    t: Literal["credit"]
    id: str
    n: int


class Cancel(TypedDict):
    t: Literal["cancel"]
    id: str
    reason: str


class Stop(TypedDict):
    t: Literal["stop"]     # run preStop, answer `stopped`, exit
    grace: NotRequired[float]  # preStop's time at most (the node's preStopGraceSeconds), besides its own bound


class StreamReply(TypedDict, total=False):
    t: Literal["stream_reply"]
    seq: int
    value: Any
    error: str             # class name in runtime.errors
    message: str


# -- worker -> frontend ------------------------------------------------------------------------
class Loaded(TypedDict):
    t: Literal["loaded"]   # the code is imported (or not); the initializer runs next
    kind: str | None       # the handler's kind (runtime.deployment.handler_kind), None on error
    error: str | None      # why the import failed: the deploy is refused with this message
    # the module's runpod.serverless.start() options: {"concurrency": n | None, "aggregate_stream": bool}
    runpod: NotRequired[dict[str, Any] | None]


class Ready(TypedDict):
    t: Literal["ready"]
    pid: int
    init_error: str | None


class Write(TypedDict):
    t: Literal["write"]    # stream writes of one invocation, already encoded as text; several when
    id: str                # they queued while the socket was busy (coalesced into one frame)
    p: list[str]


class Item(TypedDict):
    t: Literal["item"]     # generator items of a plain JSON request (aggregated by the frontend)
    id: str
    v: list[Any]


class Result(TypedDict):
    t: Literal["result"]
    id: str
    json: str              # the JSON-encoded return value
    retire: NotRequired[bool]  # RunPod's refresh_worker: the worker exits after this (a fresh one next)


class Progress(TypedDict):
    t: Literal["progress"]  # runpod.serverless.progress_update() of the invocation's job
    id: str
    v: Any


class Error(TypedDict):
    t: Literal["error"]
    id: str
    error: str             # class name in runtime.errors or runtime.process.errors
    message: str
    retire: bool           # the worker exits after this frame: never hand it another invocation


class Log(TypedDict):
    t: Literal["log"]
    name: str
    level: int
    msg: str            # formatted in the worker (a traceback included)
    invocation_id: str  # of the invocation that logged ("" outside one): the worker's claim, which the
                        # pool checks (WorkerProcess._handle) and completes with trace id and function


class Stopped(TypedDict):
    t: Literal["stopped"]
    error: str | None      # what preStop raised, if anything


class StreamCall(TypedDict):
    t: Literal["stream_call"]
    seq: int
    op: str
    args: list[Any]


ToWorker = Hello | Invoke | Credit | Cancel | Stop | StreamReply
ToFrontend = Loaded | Ready | Write | Item | Result | Error | Progress | Log | Stopped | StreamCall
Frame = ToWorker | ToFrontend
#: every `t` the protocol knows; `recv` refuses any other frame.
TAGS = frozenset(get_args(get_type_hints(message)["t"])[0] for message in get_args(Frame))

SendT = TypeVar("SendT", ToWorker, ToFrontend)
RecvT = TypeVar("RecvT", ToWorker, ToFrontend)


_packers = threading.local()


def _packb(msg: Any) -> bytes:
    """`msgpack.packb(msg, use_bin_type=True)` with this thread's Packer: packb builds (and frees)
    a Packer and its buffer on every call, and parses its keyword arguments."""
    try:
        packer: msgpack.Packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(msg)


class ConnectionClosed(EOFError):
    """The other end closed the socket (or died)."""


class ProtocolError(ValueError):
    """A frame that is not what the protocol allows (too large, not a msgpack map)."""


class Connection(Generic[SendT, RecvT]):
    """Frames over a blocking stream socket. `send` may be called from any thread.

    The frontend holds a `Connection[ToWorker, ToFrontend]`, the worker the reverse."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._rbuf = bytearray()  # received, not yet parsed (only the one reader thread touches it)
        self._rpos = 0

    @property
    def sending(self) -> bool:
        """A send is under way (a thread may be finishing a frame `try_send_bytes` began)."""
        return self._send_lock.locked()

    def send(self, msg: SendT) -> None:
        data = _packb(msg)
        if len(data) > MAX_FRAME:
            raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
        with self._send_lock:
            try:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from exc

    def send_many(self, msgs: list[SendT]) -> None:
        """Several frames in one `sendall` (what queued while the socket was busy)."""
        parts: list[bytes] = []
        for msg in msgs:
            data = _packb(msg)
            if len(data) > MAX_FRAME:
                raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
            parts.append(_HEADER.pack(len(data)))
            parts.append(data)
        with self._send_lock:
            try:
                self.sock.sendall(b"".join(parts))
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from exc

    @staticmethod
    def pack(msg: Frame) -> bytes:
        """One frame, header included (for callers that batch frames themselves)."""
        data = _packb(msg)
        if len(data) > MAX_FRAME:
            raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
        return _HEADER.pack(len(data)) + data

    def try_send(self, msg: SendT) -> bool | None:
        """Send a small frame without blocking: True when it went (or is going) out, None when the
        caller must use `send` from a thread (a large frame, or another sender holds the socket)."""
        frame = self.pack(msg)
        return None if len(frame) > TRY_SEND_MAX else self.try_send_bytes(frame)

    def try_send_bytes(self, frame: bytes) -> bool | None:
        """`try_send` for frames already packed (one or several)."""
        if not self._send_lock.acquire(blocking=False):
            return None
        try:
            sent = self.sock.send(frame, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._send_lock.release()
            raise ConnectionClosed(str(exc)) from exc
        if sent == len(frame):
            self._send_lock.release()
            return True
        # The socket buffer is full: a thread sends the rest, holding the lock so frames never interleave.
        threading.Thread(target=self._finish_send, args=(frame[sent:],), daemon=True).start()
        return True

    def send_bytes(self, frame: bytes) -> None:
        """Frames already packed, blocking (from a thread)."""
        with self._send_lock:
            try:
                self.sock.sendall(frame)
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from exc

    def _finish_send(self, rest: bytes) -> None:
        try:
            self.sock.sendall(rest)
        except OSError:
            pass  # the other end died: its reader notices
        finally:
            self._send_lock.release()

    def recv(self) -> RecvT:
        (size,) = _HEADER.unpack(self._read(_HEADER.size))
        if size > MAX_FRAME:
            raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
        msg = msgpack.unpackb(self._read(size), raw=False)
        if not isinstance(msg, dict) or msg.get("t") not in TAGS:
            raise ProtocolError("a frame must be a msgpack map whose 't' field names a message of the protocol")
        return cast(RecvT, msg)

    def _read(self, n: int) -> bytes:
        """Exactly `n` bytes. Reads in large chunks into a buffer, so the frames that arrived
        together cost one system call, not two each."""
        buf = self._rbuf
        while len(buf) - self._rpos < n:
            if self._rpos:
                del buf[:self._rpos]
                self._rpos = 0
            try:
                chunk = self.sock.recv(max(READ_CHUNK, n - len(buf)))
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from exc
            if not chunk:
                raise ConnectionClosed("connection closed")
            buf += chunk
        data = bytes(buf[self._rpos:self._rpos + n])
        self._rpos += n
        if self._rpos == len(buf):
            buf.clear()
            self._rpos = 0
        return data

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the other end
        self.sock.close()
