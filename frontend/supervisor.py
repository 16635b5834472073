"""`fnstream serve --processes N`: N cluster-mode frontends on one port, supervised as uvicorn's `--workers`.

Each child is a whole `fnstream serve` binding the port itself with SO_REUSEPORT (`frontend.reusePort`),
so the kernel spreads new connections across them. The supervisor restarts a child that dies, forwards
SIGINT/SIGTERM to every child, and returns one exit code: 0 when every child stopped cleanly. A child
that exits with 2 (bad config or deploy directory) would fail again, so it stops the whole group.
Only cluster mode may run several: embedded streams, deployments and invocations live in one process.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

__all__ = ("supervise",)

log = logging.getLogger("fnstream.supervisor")

_PR_SET_PDEATHSIG = 1
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class _Child:
    """One supervised frontend process and how often it died young in a row."""

    def __init__(self, slot: int, cmd: list[str]) -> None:
        self.slot, self.cmd = slot, cmd
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.quick_deaths = 0
        self.restart_at = 0.0
        self.signalled = False  # the stop signal was forwarded to its current process

    def start(self) -> None:
        # Its own process group: a terminal's Ctrl-C reaches the supervisor only, which forwards it once.
        # preexec_fn is safe here: the supervisor runs no other threads.
        self.signalled = False
        self.proc = subprocess.Popen(self.cmd, env={**os.environ, "FNSTREAM_PROCESS_SLOT": str(self.slot)},
                                     process_group=0,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.started = time.monotonic()
        log.info("frontend %d started (pid %d)", self.slot, self.proc.pid)

    def forward(self, signum: int, *, unless_signalled: bool = False) -> None:
        """Send it `signum` (a second Ctrl-C reaches it too: that stops it at once); with
        `unless_signalled`, only if no stop signal reached its current process yet."""
        if self.proc is not None and self.proc.poll() is None and not (unless_signalled and self.signalled):
            self.signalled = True
            self.proc.send_signal(signum)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def supervise(cmd: list[str], processes: int, stop_timeout: float) -> int:
    """Run `processes` copies of `cmd` until SIGINT/SIGTERM; restart any that dies meanwhile."""
    children = [_Child(i, cmd) for i in range(processes)]
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        for child in children:
            child.forward(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in _FORWARDED}
    fatal: int | None = None
    try:
        for child in children:
            child.start()
        while not stopping and fatal is None:
            now = time.monotonic()
            for child in children:
                if child.proc is None:
                    if now >= child.restart_at:
                        child.start()
                    continue
                code = child.proc.poll()
                if code is None:
                    continue
                if code == 2:  # fnstream's "bad config / deploy": every restart would fail alike
                    log.error("frontend %d exited with 2 (bad config or deploy directory); stopping", child.slot)
                    fatal = 2
                    break
                young = now - child.started < 5
                child.quick_deaths = child.quick_deaths + 1 if young else 0
                delay = min(10.0, 0.5 * 2 ** (child.quick_deaths - 1)) if young else 0.0
                log.warning("frontend %d (pid %d) died with %d; restarting in %.1f s", child.slot, child.proc.pid,
                            code, delay)
                child.proc, child.restart_at = None, now + delay
            time.sleep(0.1)
        for child in children:  # each still running gets a stop signal: after a fatal exit, or when
            # it was being started as the signal came (and so missed it)
            child.forward(stopping[0] if stopping else signal.SIGTERM, unless_signalled=True)
        return _wait_all(children, stop_timeout, fatal, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_all(children: list[_Child], timeout: float, fatal: int | None, forwarded: list[int]) -> int:
    """Wait for every child to exit (SIGKILL after `timeout`); the group's exit code. A child ended
    by the stop signal forwarded to it (one still starting has no handler for it yet) stopped as asked."""
    deadline = time.monotonic() + timeout
    codes = []
    for child in children:
        if child.proc is None:
            continue
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("frontend %d (pid %d) did not stop in %.0f s; killing it", child.slot, child.proc.pid, timeout)
            child.proc.kill()
            child.proc.wait()
        returncode = child.proc.returncode
        codes.append(0 if -returncode in forwarded else _exit_code(returncode))
    if fatal is not None:
        return fatal
    return next((c for c in codes if c != 0), 0)
