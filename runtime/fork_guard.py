"""A handler's child processes: what they must not keep, and that they end with the server.

`end_descendants` (at exit): children a `def` handler started and left running are killed with
their own descendants, rather than outliving the server that ran the call. (A process worker's
are its process group, killed with it: runtime/process/pool.py.) `become_subreaper`: a handler's
grandchild that detaches (`setsid()`, a daemon's double fork) leaves every process group, and when
its parent ends it would be adopted by init, out of reach; a subreaper adopts it instead, so the
worker (or, after the worker, the server) still finds it among its descendants at exit.

An adopted process that ends is a zombie of ours, and nobody else will wait for it: a reaper
thread (started by `become_subreaper`) reaps it. It must not take the exit status of a child
someone does wait for (a process worker's, a handler's `subprocess.run`, asyncio's child watcher),
so it only looks at children of the main thread — where the kernel puts adopted processes; a `def`
handler's own children belong to its pool thread and are never touched — and reaps a zombie only
once it has stayed one for REAP_AFTER looks REAP_EVERY seconds apart (a waiter collects its child
at once). The one status it can take: a child started on the event loop's thread (an `async def`
handler's `subprocess.Popen`) whose status is collected seconds after it ended; such code gets
returncode 0 (`asyncio.create_subprocess_exec` waits at once and is safe).

What a forked child must not keep: the server's listening sockets, its job-store lock, a worker's
channel to the server.
A handler that forks without exec (`os.fork()`, multiprocessing's default start method) gets a copy
of every file descriptor. A child that outlives the call would keep the listening socket (new
connections queue to a process that never serves them), the job store's lock (a restart fails with
"jobs.path in use") or a process worker's socket (the server never sees the worker end). Exec'd
children are safe already: these descriptors are close-on-exec. In a forked child each registered
descriptor is replaced by /dev/null: the child no longer holds what it referred to, and a later
close of the number closes nothing of anyone else's.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ("become_subreaper", "end_descendants", "forget", "reap_adopted", "release_in_forked_children")

REAP_EVERY = 1.0  # seconds between looks for adopted zombies
REAP_AFTER = 3    # looks in a row a zombie must be seen at before it is reaped (no one waits for it)

_fds: set[int] = set()


def release_in_forked_children(fd: int) -> None:
    """Replace `fd` with /dev/null in every child this process forks from now on."""
    if not _fds:
        os.register_at_fork(after_in_child=_release)
    _fds.add(fd)


def forget(fd: int) -> None:
    """`fd` was closed here: nothing to release in later children."""
    _fds.discard(fd)


def _release() -> None:
    fds = list(_fds)
    _fds.clear()  # the child's own forks have nothing of the server's left to release
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in fds:
        try:
            os.dup2(null, fd, inheritable=False)
        except OSError:  # closed meanwhile
            pass
    os.close(null)


def _children(pid: int | str) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):  # gone meanwhile, or no such file (not Linux)
            continue
    return found


def end_descendants() -> int:
    """SIGKILL every process below this one, deepest first; how many there were."""
    order: list[int] = []
    todo = _children("self")
    while todo:
        pid = todo.pop()
        order.append(pid)
        todo += _children(pid)
    for pid in reversed(order):  # children before their parents: none is orphaned to escape
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(order)


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux prctl), and reap those that end;
    whether it could."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        adopted = bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # not Linux
        return False
    if adopted:
        threading.Thread(target=_reap_loop, name="fnstream-reaper", daemon=True).start()
    return adopted


def _reap_loop() -> None:
    looks: dict[int, int] = {}
    while True:
        time.sleep(REAP_EVERY)
        looks = reap_adopted(looks)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def reap_adopted(looks: dict[int, int]) -> dict[int, int]:
    """One look: reap the main thread's children that were zombies at the last REAP_AFTER - 1 looks
    too (`looks`: zombie pid -> looks it was one at); the counts for the next look."""
    main = os.getpid()  # the main thread's id: adopted processes are its children
    try:
        children = [int(c) for c in Path(f"/proc/{main}/task/{main}/children").read_text().split()]
    except (OSError, ValueError):  # not Linux, or no per-task children list
        return {}
    counted: dict[int, int] = {}
    for pid in children:
        if _state(pid) != "Z":
            continue
        seen = looks.get(pid, 0) + 1
        if seen < REAP_AFTER:
            counted[pid] = seen
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # its own waiter collected it meanwhile
            pass
    return counted
