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

What a forked child must not keep: the server's listening sockets and the connections it accepted,
its job store's files, its ends of the process workers' channels; a worker's channel to the server.
A handler that forks without exec (`os.fork()`, multiprocessing's default start method) gets a copy
of every file descriptor. A child that outlives the call would keep the listening socket (new
connections queue to a process that never serves them), the job store's lock (a restart fails with
"jobs.path in use"), a client's connection (the client never sees it close) or either end of a
process worker's channel (the worker never sees the server end, nor the server the worker). Exec'd
children are safe already: these descriptors are close-on-exec. In a forked child each of them is
replaced by /dev/null: the child no longer holds what it referred to, and a later close of the
number closes nothing of anyone else's. Registered are single descriptors (`release_in_forked_children`),
files by path prefix (`release_files_in_forked_children`: SQLite opens its WAL and shared memory
when it likes) and a listener's accepted connections (`release_listener_in_forked_children`: found
in the child by their local port, so accepting costs nothing).

A forked child also ends with the process it was forked from, even one kill -9'd (where no code of
ours runs at exit): it gets PR_SET_PDEATHSIG SIGKILL. That signal comes when the *thread* that forked
ends, so only a fork from a thread that lasts as long as the process gets it: the main thread, a
handler pool's threads (`lasting_thread`). A child forked from a thread the handler started itself
would die as that thread ended; it is left as before (ended at a clean exit, `end_descendants`).
Grandchildren are the child's own.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import threading
import time
from pathlib import Path

__all__ = ("become_subreaper", "end_descendants", "forget", "forget_files", "lasting_thread", "reap_adopted",
           "release_files_in_forked_children", "release_in_forked_children", "release_listener_in_forked_children")

REAP_EVERY = 1.0  # seconds between looks for adopted zombies
REAP_AFTER = 3    # looks in a row a zombie must be seen at before it is reaped (no one waits for it)

_fds: set[int] = set()
_files: set[str] = set()       # path prefixes
_ports: set[int] = set()       # local ports of listeners whose accepted connections are released
_lasting: set[int] = set()     # idents of threads that live as long as this process
_owner = 0                     # the pid whose forks the hook guards (0: none, or a child's own forks)
_PR_SET_PDEATHSIG = 1


def _guard() -> None:
    global _owner
    if not _owner:
        _owner = os.getpid()
        main = threading.main_thread().ident
        if main is not None:
            _lasting.add(main)
        os.register_at_fork(after_in_child=_in_child)


def release_in_forked_children(fd: int) -> None:
    """Replace `fd` with /dev/null in every child this process forks from now on."""
    _guard()
    _fds.add(fd)


def forget(fd: int) -> None:
    """`fd` is about to be closed here: nothing to release in later children (called before the
    close, the number cannot meanwhile be another descriptor's)."""
    _fds.discard(fd)


def release_files_in_forked_children(prefix: str) -> None:
    """Replace every descriptor of a file whose path starts with `prefix` in every child forked from now on."""
    _guard()
    _files.add(prefix)


def forget_files(prefix: str) -> None:
    _files.discard(prefix)


def release_listener_in_forked_children(sock: socket.socket) -> None:
    """Replace the listening `sock`, and every connection on its local port (one it accepted), in
    every child forked from now on."""
    release_in_forked_children(sock.fileno())
    _ports.add(sock.getsockname()[1])


def lasting_thread(lasting: bool = True) -> None:
    """The calling thread lives as long as its process (False: it is ending): a child forked from it
    gets PR_SET_PDEATHSIG, so it dies with the process."""
    (_lasting.add if lasting else _lasting.discard)(threading.get_ident())


def _in_child() -> None:
    global _owner
    parent, _owner = _owner, 0  # the child's own forks are its business
    if not parent:
        return
    if threading.get_ident() in _lasting and _die_with_parent(parent):
        return
    fds = set(_fds) | _by_target()
    _fds.clear()
    _files.clear()
    _ports.clear()
    _lasting.clear()
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in fds:
        try:
            os.dup2(null, fd, inheritable=False)
        except OSError:  # closed meanwhile
            pass
    os.close(null)


def _die_with_parent(parent: int) -> bool:
    """PR_SET_PDEATHSIG SIGKILL; if the parent ended before it took, end now. Whether we are ending."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
        return True
    return False


def _accepted_inodes() -> set[str]:
    found: set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] != "0A" and int(fields[1].rsplit(":", 1)[1], 16) in _ports:
                found.add(f"socket:[{fields[9]}]")
    return found


def _by_target() -> set[int]:
    """Descriptors of the registered files and accepted connections (read from /proc)."""
    if not _files and not _ports:
        return set()
    prefixes = tuple(_files)
    sockets = _accepted_inodes() if _ports else set()
    found: set[int] = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # not Linux
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, gone by now
            continue
        if target in sockets or (prefixes and target.startswith(prefixes)):
            found.add(int(name))
    return found


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
