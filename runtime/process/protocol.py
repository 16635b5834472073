"""The frontend <-> worker wire protocol: length-prefixed msgpack frames over a Unix socket.

A frame is a 4-byte big-endian length followed by one msgpack map whose `t` field names the
message. Both ends use blocking sockets from threads (the worker has no event loop of ours and
the frontend reads each worker from a dedicated thread), so `Connection` is deliberately simple.
Backpressure is credit-based: the worker may have at most `credits` stream writes unacknowledged;
the frontend returns one credit per write once the write is in the invocation's bounded channel.
"""
from __future__ import annotations

import socket
import struct
import threading
from typing import Any, Generic, Literal, TypedDict, TypeVar, cast, get_args, get_type_hints

import msgpack

__all__ = (
    "Connection", "ConnectionClosed", "ProtocolError", "MAX_FRAME", "DEFAULT_CREDITS",
    "Hello", "Invoke", "Credit", "Cancel", "Stop", "Loaded", "Ready", "Write", "Item", "Result", "Error",
    "Log", "Stopped", "StreamCall", "StreamReply", "ToWorker", "ToFrontend", "Frame", "TAGS",
)

_HEADER = struct.Struct(">I")
# Bigger than any event (maxRequestBodySize) or write (maxWriteSize) fnstream accepts.
MAX_FRAME = 64 * 1024 * 1024
DEFAULT_CREDITS = 8


# -- frontend -> worker ------------------------------------------------------------------------
class Hello(TypedDict):
    t: Literal["hello"]
    spec: dict[str, Any]            # FunctionSpec.model_dump(mode="json")
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


class Ready(TypedDict):
    t: Literal["ready"]
    pid: int
    init_error: str | None


class Write(TypedDict):
    t: Literal["write"]    # one stream write, already encoded as text
    id: str
    p: str


class Item(TypedDict):
    t: Literal["item"]     # one generator item of a plain JSON request (aggregated by the frontend)
    id: str
    v: Any


class Result(TypedDict):
    t: Literal["result"]
    id: str
    json: str              # the JSON-encoded return value


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
    msg: str


class Stopped(TypedDict):
    t: Literal["stopped"]
    error: str | None      # what preStop raised, if anything


class StreamCall(TypedDict):
    t: Literal["stream_call"]
    seq: int
    op: str
    args: list[Any]


ToWorker = Hello | Invoke | Credit | Cancel | Stop | StreamReply
ToFrontend = Loaded | Ready | Write | Item | Result | Error | Log | Stopped | StreamCall
Frame = ToWorker | ToFrontend
#: every `t` the protocol knows; `recv` refuses any other frame.
TAGS = frozenset(get_args(get_type_hints(message)["t"])[0] for message in get_args(Frame))

SendT = TypeVar("SendT", ToWorker, ToFrontend)
RecvT = TypeVar("RecvT", ToWorker, ToFrontend)


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

    def send(self, msg: SendT) -> None:
        data = msgpack.packb(msg, use_bin_type=True)
        if len(data) > MAX_FRAME:
            raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
        with self._send_lock:
            try:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from exc

    def recv(self) -> RecvT:
        (size,) = _HEADER.unpack(self._read(_HEADER.size))
        if size > MAX_FRAME:
            raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
        msg = msgpack.unpackb(self._read(size), raw=False)
        if not isinstance(msg, dict) or msg.get("t") not in TAGS:
            raise ProtocolError("a frame must be a msgpack map whose 't' field names a message of the protocol")
        return cast(RecvT, msg)

    def _read(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from exc
            if k == 0:
                raise ConnectionClosed("connection closed")
            got += k
        return bytes(buf)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the other end
        self.sock.close()
