"""The worker's outbox: one bounded queue of frames and the writer thread that empties it.

Apart from the main loop because it is the worker's only way out: whatever queued while the socket
was busy goes out in one system call, and the stream writes of one invocation in one frame.
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...logs import log_context
from ..protocol import Connection, ConnectionClosed, Error, Item, ProtocolError, Result, ToFrontend, ToWorker, Write

__all__ = ("FLUSH_BEFORE_EXIT", "FrameLogHandler", "Outbox", "coalesce", "hard_exit")

hard_exit = os._exit  # the worker's own exits; a handler's os._exit is wrapped to flush first (main)

OUTBOX_FRAMES = 4096      # frames waiting for the writer thread (writes are also bounded by credits)
BATCH_FRAMES = 256        # at most this many frames per system call
BATCH_BYTES = 1 << 20     # ... or about this many payload bytes
FLUSH_BEFORE_EXIT = 2.0   # seconds a worker leaving on its own waits for its last frames to go out


class Outbox:
    """Frames for the frontend, sent in order from one writer thread (`write_loop`).

    Posting is two C calls (a deque append, a token for the writer's wake-up), so a handler's write
    costs no Python-level queue; the writer takes everything queued under `_sending`, which it holds
    until those frames are on the socket — so whoever holds it with nothing queued knows every frame
    posted before is out (`post_outcome`, `flush`). A stream write from a handler thread
    (`post_write`) joins its invocation's write frame while that one is still queued: one frame and
    one wake-up of the writer for every write a handler makes before the writer runs.
    """

    def __init__(self, conn: Connection[ToFrontend, ToWorker]) -> None:
        self.conn = conn
        self._frames: deque[ToFrontend] = deque()
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()  # one per frame posted: wakes the writer
        self._sending = threading.Lock()
        # The payload list of each invocation's write frame still queued and still its last queued
        # write or item, which later writes join. The writer takes frames under `_open_lock` and
        # closes theirs; `post` of another write or item of the invocation closes it too (a write
        # after it must not join a frame ahead of it). A later write then makes a new frame.
        self._open: dict[str, list[str]] = {}
        self._open_lock = threading.Lock()

    def post(self, frame: ToFrontend) -> None:
        frames = self._frames
        if len(frames) >= OUTBOX_FRAMES:  # only a flood of logs gets here: writes are bounded by credits
            self._wait_for_room()
        if frame["t"] == "write" or frame["t"] == "item":  # (a loop's write, a job's item)
            with self._open_lock:
                self._open.pop(frame["id"], None)
                frames.append(frame)
                self._tokens.put(None)
            return
        frames.append(frame)
        self._tokens.put(None)

    def post_write(self, inv_id: str, payload: str) -> None:
        """A stream write (after its credit): into its invocation's queued write frame, or a new one."""
        if len(self._frames) >= OUTBOX_FRAMES and inv_id not in self._open:  # (outside the lock the writer needs)
            self._wait_for_room()
        with self._open_lock:
            payloads = self._open.get(inv_id)
            if payloads is not None:
                payloads.append(payload)
                return
            payloads = [payload]
            self._frames.append({"t": "write", "id": inv_id, "p": payloads})
            self._tokens.put(None)
            self._open[inv_id] = payloads  # (queued first: a cancel raised between leaves no open list unqueued)

    def _wait_for_room(self) -> None:
        while len(self._frames) >= OUTBOX_FRAMES:
            time.sleep(0.001)

    def post_outcome(self, frame: Result | Error) -> None:
        """A result goes straight out when nothing is queued before it (no hop to the writer thread).

        Safe here: the handler has returned, so no cancel can be raised in this thread any more,
        and with nothing queued and `_sending` held every earlier frame is already on the socket.
        """
        if not self._frames and self._sending.acquire(blocking=False):
            try:
                if not self._frames and self.conn.try_send(frame):
                    return
            except (ConnectionClosed, ProtocolError, TypeError, ValueError):
                pass  # the writer thread reports or exits
            finally:
                self._sending.release()
        self.post(frame)

    def flush(self, timeout: float = FLUSH_BEFORE_EXIT) -> None:
        """Wait (bounded) until every frame posted so far is on the socket (a frame's rest that a
        thread finishes sending too: `post_outcome` may have left one to it)."""
        deadline = time.monotonic() + timeout
        while (self._frames or self._sending.locked() or self.conn.sending) and time.monotonic() < deadline:
            time.sleep(0.005)

    def write_loop(self) -> None:
        frames = self._frames
        wait, take_token = self._tokens.get, self._tokens.get_nowait
        while True:
            wait()
            with self._sending:
                if not frames:
                    continue  # the token of a frame an earlier batch took
                with self._open_lock:  # the write frames taken are closed: later writes make new ones
                    batch = [frames.popleft()]
                    size = 0
                    while frames and len(batch) < BATCH_FRAMES and size < BATCH_BYTES:
                        frame = frames.popleft()
                        batch.append(frame)
                        if frame["t"] == "write":
                            size += sum(map(len, frame["p"]))
                    if self._open:
                        for frame in batch:
                            if frame["t"] == "write" and self._open.get(frame["id"]) is frame["p"]:
                                del self._open[frame["id"]]
                out = coalesce(batch)
                try:
                    self.conn.send_many(out)
                except ConnectionClosed:
                    hard_exit(0)  # the frontend is gone
                except Exception as exc:  # (msgpack's OverflowError too: the writer must outlive any frame)
                    self._send_one_by_one(out, exc)
            # The tokens of the frames this batch took, so the writer does not wake once per frame.
            try:
                for _ in range(len(batch) - 1):
                    take_token()
            except queue.Empty:
                pass  # a poster between its append and its token: the token wakes us once, in vain

    def _send_one_by_one(self, frames: list[ToFrontend], exc: Exception) -> None:
        """A frame could not be encoded: send the others, report the bad one."""
        for frame in frames:
            try:
                self.conn.send(frame)
            except ConnectionClosed:
                hard_exit(0)
            except Exception as err:
                sys.stderr.write(f"fnstream worker: dropped a {frame['t']!r} frame: {type(err).__name__}: {err}\n")


def coalesce(frames: list[ToFrontend]) -> list[ToFrontend]:
    """Merge the stream writes (and items) of one invocation queued together into its first frame.

    Order per invocation is kept: a write only moves earlier, never past its own result, nor past
    an item of its invocation (a job's writes and items share its channel), and the same for items.
    """
    if len(frames) == 1:
        return frames
    out: list[ToFrontend] = []
    writes: dict[str, Write] = {}
    items: dict[str, Item] = {}
    for frame in frames:
        if frame["t"] == "write":
            items.pop(frame["id"], None)  # a later item of it must not move ahead of this write
            first_write = writes.get(frame["id"])
            if first_write is not None:
                first_write["p"].extend(frame["p"])
                continue
            writes[frame["id"]] = frame
        elif frame["t"] == "item":
            writes.pop(frame["id"], None)
            first_item = items.get(frame["id"])
            if first_item is not None:
                first_item["v"].extend(frame["v"])
                continue
            items[frame["id"]] = frame
        elif frame["t"] == "result" or frame["t"] == "error":
            writes.pop(frame["id"], None)
            items.pop(frame["id"], None)
        out.append(frame)
    return out


class FrameLogHandler(logging.Handler):
    """Forwards the worker's log records to the frontend's logging as frames (`post`), with the id of
    the invocation that logged (runtime/logs.py: set around each invocation); the pool adds its trace
    id and the function, whose they are being the pool's to say."""

    def __init__(self, post: Callable[[Any], None]) -> None:
        super().__init__(logging.INFO)
        self._post = post

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _trace_id, _function, invocation_id = log_context()  # the pool adds the others itself
            self._post({"t": "log", "name": record.name, "level": record.levelno, "msg": self.format(record),
                        "invocation_id": invocation_id})
        except Exception:  # logging must never fail the handler
            self.handleError(record)
