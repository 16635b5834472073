"""The frontend <-> worker wire protocol: msgpack frames over a real Unix socket pair."""
from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from runtime.process import protocol
from runtime.process.protocol import TAGS, Connection, ConnectionClosed, ProtocolError, ToFrontend, ToWorker

# One frame of every message, as the two ends build them.
TO_WORKER: list[ToWorker] = [
    {"t": "hello", "spec": {"name": "f", "timeout": 3}, "code_roots": ["/srv/fn"], "credits": 8},
    {"t": "invoke", "id": "i1", "trace_id": "tr", "event": {"x": [1, 2.5, None, "é"]}, "streaming": True,
     "timeout": 2.5, "max_write_size": 1024},
    {"t": "credit", "id": "i1", "n": 1},
    {"t": "cancel", "id": "i1", "reason": "the client disconnected"},
    {"t": "stop"},
    {"t": "stream_reply", "seq": 3, "value": [[1, b"\x00\xff"]]},
    {"t": "stream_reply", "seq": 4, "error": "StreamNotFoundError", "message": "stream 's' does not exist"},
]
TO_FRONTEND: list[ToFrontend] = [
    {"t": "loaded", "kind": "sync", "error": None},
    {"t": "ready", "pid": 1234, "init_error": None},
    {"t": "write", "id": "i1", "p": '{"token":"hi"}'},
    {"t": "item", "id": "i1", "v": {"n": 1}},
    {"t": "result", "id": "i1", "json": "[1,2]"},
    {"t": "progress", "id": "i1", "v": {"percent": 50}},
    {"t": "error", "id": "i1", "error": "HandlerError", "message": "boom", "retire": False},
    {"t": "log", "name": "user", "level": 20, "msg": "hello"},
    {"t": "stopped", "error": None},
    {"t": "stream_call", "seq": 3, "op": "publish", "args": ["s", [b"\x00"], None]},
]


@pytest.fixture
def pair() -> Iterator[tuple[Connection[ToWorker, ToFrontend], Connection[ToFrontend, ToWorker]]]:
    """(the frontend's end, the worker's end) of one socket pair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    frontend: Connection[ToWorker, ToFrontend] = Connection(a)
    worker: Connection[ToFrontend, ToWorker] = Connection(b)
    yield frontend, worker
    frontend.close()
    worker.close()


def test_every_message_round_trips_both_ways(pair: Any) -> None:
    frontend, worker = pair
    for frame in TO_WORKER:
        frontend.send(frame)
        assert worker.recv() == frame
    for frame in TO_FRONTEND:
        worker.send(frame)
        assert frontend.recv() == frame


def test_the_known_tags_are_exactly_the_messages_of_the_protocol() -> None:
    assert {f["t"] for f in TO_WORKER} | {f["t"] for f in TO_FRONTEND} == TAGS


def test_a_frame_arriving_in_pieces_is_reassembled(pair: Any) -> None:
    frontend, worker = pair
    data = msgpack.packb({"t": "write", "id": "i", "p": "x" * 100_000}, use_bin_type=True)
    wire = struct.pack(">I", len(data)) + data

    def trickle() -> None:
        for start in range(0, len(wire), 7919):
            worker.sock.sendall(wire[start:start + 7919])
            time.sleep(0.001)

    thread = threading.Thread(target=trickle)
    thread.start()
    assert frontend.recv() == {"t": "write", "id": "i", "p": "x" * 100_000}
    thread.join()


def test_sends_from_many_threads_never_interleave(pair: Any) -> None:
    frontend, worker = pair
    threads = [threading.Thread(target=lambda n=n: [worker.send({"t": "write", "id": f"t{n}", "p": "y" * 5000 * n})
                                                    for _ in range(50)]) for n in range(1, 7)]
    for thread in threads:
        thread.start()
    got = [frontend.recv() for _ in range(300)]
    for thread in threads:
        thread.join()
    assert all(f["p"] == "y" * 5000 * int(f["id"][1:]) for f in got)
    assert sorted(f["id"] for f in got) == sorted(f"t{n}" for n in range(1, 7) for _ in range(50))


@pytest.mark.parametrize("payload", [msgpack.packb([1, 2]), msgpack.packb({"no": "tag"}), msgpack.packb({"t": "nope"})])
def test_a_frame_that_is_no_message_of_the_protocol_is_refused(pair: Any, payload: bytes) -> None:
    frontend, worker = pair
    worker.sock.sendall(struct.pack(">I", len(payload)) + payload)
    with pytest.raises(ProtocolError, match="'t' field"):
        frontend.recv()


def test_oversized_frames_are_refused_at_both_ends(pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    frontend, worker = pair
    monkeypatch.setattr(protocol, "MAX_FRAME", 1000)
    with pytest.raises(ProtocolError, match="exceeds 1000"):
        worker.send({"t": "write", "id": "i", "p": "z" * 2000})
    worker.sock.sendall(struct.pack(">I", 1001))  # a header announcing too much: refused before reading it
    with pytest.raises(ProtocolError, match="frame of 1001 bytes exceeds 1000"):
        frontend.recv()


def test_a_peer_that_goes_away_is_connection_closed(pair: Any) -> None:
    frontend, worker = pair
    worker.sock.sendall(struct.pack(">I", 50) + b"half a frame")
    worker.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(ConnectionClosed):
        frontend.recv()
    with pytest.raises(ConnectionClosed):
        frontend.send({"t": "stop"})
