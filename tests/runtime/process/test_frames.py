"""Frame coalescing in the worker's writer: writes of one invocation merge, order is kept."""
from __future__ import annotations

from runtime.process.child.outbox import coalesce


def test_writes_of_one_invocation_merge_into_its_first_frame():
    frames = [{"t": "write", "id": "a", "p": ["1"]}, {"t": "write", "id": "b", "p": ["x"]},
              {"t": "write", "id": "a", "p": ["2"]}, {"t": "log", "name": "n", "level": 20, "msg": "m"},
              {"t": "write", "id": "a", "p": ["3"]}]
    assert coalesce(frames) == [{"t": "write", "id": "a", "p": ["1", "2", "3"]},
                                 {"t": "write", "id": "b", "p": ["x"]},
                                 {"t": "log", "name": "n", "level": 20, "msg": "m"}]


def test_a_write_never_moves_past_its_invocations_result():
    frames = [{"t": "write", "id": "a", "p": ["1"]}, {"t": "result", "id": "a", "json": "null"},
              {"t": "write", "id": "a", "p": ["late"]}, {"t": "item", "id": "c", "v": [1]},
              {"t": "item", "id": "c", "v": [2]}]
    assert coalesce(frames) == [{"t": "write", "id": "a", "p": ["1"]}, {"t": "result", "id": "a", "json": "null"},
                                 {"t": "write", "id": "a", "p": ["late"]}, {"t": "item", "id": "c", "v": [1, 2]}]


def test_a_lone_frame_goes_as_it_is():
    frame = {"t": "write", "id": "a", "p": ["only"]}
    assert coalesce([frame]) == [frame]


def test_a_progress_frame_crosses_the_socket():
    """RunPod's progress_update from a worker: a frame of the protocol (recv refuses unknown ones)."""
    import socket

    from runtime.process.protocol import Connection

    a, b = socket.socketpair()
    sender, receiver = Connection(a), Connection(b)
    try:
        sender.send({"t": "progress", "id": "inv-1", "v": {"step": 1}})
        assert receiver.recv() == {"t": "progress", "id": "inv-1", "v": {"step": 1}}
    finally:
        sender.close()
        receiver.close()


async def test_no_credit_goes_back_for_an_invocation_whose_outcome_came_with_its_writes():
    """A short stream's writes and result reach the frontend together: the worker is done with it,
    and a credit frame would only wake it. A stream still running gets its credits."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from runtime.channel import OutputChannel
    from runtime.process.worker_process import PooledCall, WorkerProcess

    loop = asyncio.get_running_loop()
    sent: list[dict] = []
    worker = WorkerProcess.__new__(WorkerProcess)  # the frontend's half alone: no process behind it
    worker._inbox, worker._inbox_lock = [], threading.Lock()
    worker.send_on_loop = lambda frame: sent.append(frame) or True  # type: ignore[method-assign]

    def job(inv_id: str) -> PooledCall:
        return PooledCall(SimpleNamespace(id=inv_id, loop=loop, streaming=True,  # type: ignore[arg-type]
                                          channel=OutputChannel(loop, 100)))

    short, running = job("short"), job("running")
    worker._inbox = [(short, {"t": "write", "id": "short", "p": ["a", "b"]}),
                     (running, {"t": "write", "id": "running", "p": ["c"]}),
                     (short, {"t": "result", "id": "short", "json": "1"})]
    worker._take_inbox()
    assert sent == [{"t": "credit", "id": "running", "n": 1}]
    assert short.future.result() == ("result", 1)
    assert (short.inv.channel.take(), running.inv.channel.take()) == (["a", "b"], ["c"])


def test_a_handler_threads_writes_join_its_queued_write_frame_until_the_writer_takes_it():
    """One frame and one wake-up of the writer for the writes made before it runs; a write after
    it took the frame starts a new one, and a result never overtakes a write."""
    import socket
    import threading

    from runtime.process.child.outbox import Outbox
    from runtime.process.protocol import Connection

    a, b = socket.socketpair()
    outbox, receiver = Outbox(Connection(a)), Connection(b)
    try:
        for payload in ("1", "2", "3"):
            outbox.post_write("a", payload)
        outbox.post_write("b", "x")
        outbox.post({"t": "result", "id": "a", "json": "null"})
        threading.Thread(target=outbox.write_loop, daemon=True).start()
        assert [receiver.recv() for _ in range(3)] == [
            {"t": "write", "id": "a", "p": ["1", "2", "3"]}, {"t": "write", "id": "b", "p": ["x"]},
            {"t": "result", "id": "a", "json": "null"}]
        outbox.post_write("b", "y")  # its first frame went: a new one
        assert receiver.recv() == {"t": "write", "id": "b", "p": ["y"]}
    finally:
        receiver.close()
        a.close()


def _outbox_pair():
    import socket
    import threading

    from runtime.process.child.outbox import Outbox
    from runtime.process.protocol import Connection

    a, b = socket.socketpair()
    outbox = Outbox(Connection(a))
    threading.Thread(target=outbox.write_loop, daemon=True).start()
    return outbox, Connection(b), a


def test_a_thread_write_never_joins_a_frame_ahead_of_the_loops_write():
    """An async handler writing from its coroutine and from a thread: a write posted whole (the
    loop's) closes the thread's open frame, so the thread's next write comes after it; and the
    writer's merge keeps writes and items in the order they were made."""
    outbox, receiver, sock = _outbox_pair()
    try:
        with outbox._sending:  # the writer waits: all five are queued before it takes any
            outbox.post_write("x", "1")
            outbox.post({"t": "write", "id": "x", "p": ["2"]})
            outbox.post_write("x", "3")
            outbox.post({"t": "item", "id": "x", "v": [4]})  # (a job's: writes and items share its channel)
            outbox.post_write("x", "5")
        seen: list = []
        while len(seen) < 5:
            frame = receiver.recv()
            seen.extend(frame["p"] if frame["t"] == "write" else frame["v"])
        assert seen == ["1", "2", "3", 4, "5"]
    finally:
        receiver.close()
        sock.close()


def test_a_frame_msgpack_cannot_encode_is_dropped_and_the_writer_goes_on():
    """An integer past 64 bits (a generator's item, a progress value) made msgpack raise
    OverflowError, which ended the writer thread: nothing left the worker any more."""
    outbox, receiver, sock = _outbox_pair()
    try:
        outbox.post({"t": "item", "id": "big", "v": [2 ** 64]})
        outbox.post({"t": "result", "id": "other", "json": "1"})
        assert receiver.recv() == {"t": "result", "id": "other", "json": "1"}
        outbox.post({"t": "result", "id": "later", "json": "2"})
        assert receiver.recv() == {"t": "result", "id": "later", "json": "2"}
    finally:
        receiver.close()
        sock.close()


def test_flush_waits_for_the_rest_of_a_frame_a_thread_is_sending():
    """A result sent straight (`post_outcome`) into a full socket leaves its rest to a thread:
    a worker about to exit flushes, and must not cut it off."""
    import socket
    import threading
    import time

    from runtime.process.child.outbox import Outbox
    from runtime.process.protocol import TRY_SEND_MAX, Connection

    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    outbox, receiver = Outbox(Connection(a)), Connection(b)
    got: list = []
    try:
        text = '"' + "x" * (TRY_SEND_MAX - 100) + '"'  # goes straight, and fills the small buffer
        outbox.post_outcome({"t": "result", "id": "r", "json": text})
        assert outbox.conn.sending  # its rest is a thread's to send, once the frontend reads
        reader = threading.Thread(target=lambda: (time.sleep(0.2), got.append(receiver.recv())), daemon=True)
        reader.start()
        outbox.flush(timeout=10)
        assert not outbox.conn.sending  # flushed: all of it went
        reader.join(10)
        assert got == [{"t": "result", "id": "r", "json": text}]
    finally:
        receiver.close()
        a.close()
