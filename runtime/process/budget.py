"""The worker processes one node runs, across every process function (`runtime.maxWorkerProcesses`).

A hard cap: every worker counts from the moment it is started (while it imports, starts, serves,
retires or stops) until it exits, and no worker starts past the limit. Each pool holds
max(minInstances, 1) from its deploy on, whether or not a worker runs: a scale-to-zero function
keeps a slot for its cold start, so no other function's workers ever take it. A deploy joins
only if the workers held on the node — each pool's hold, or what it runs if more — leave room for
its own hold (else 429, runtime/registry.py): what was accepted always fits again, in any order
(a restart). A scale-out past a pool's hold takes only room no pool holds, while there is some;
past it the function's calls wait for a slot on the workers it has (within their deadline), as
they do at its maxInstances. While a function waits for room (a call, or a deploy), the others
stop their idle workers above their hold at once instead of after `scaleDownIdleSeconds`, and a
busy one above its hold exits after its current calls when the waiting function has fewer
scale-outs than it (`yields`): no function's scale-outs starve another's.

The one overlap: a redeploy starts the new code's workers before the replaced ones stop (calls
never wait on a deploy), so for that moment the replaced ones count on top.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Collection
from typing import Any

__all__ = ("WorkerBudget",)


class _Held:
    __slots__ = ("left", "live", "reserved")

    def __init__(self, reserved: int) -> None:
        self.reserved = reserved  # workers held for the pool whether or not they run (max(minInstances, 1))
        self.live = 0             # its workers started and not yet exited
        self.left = False         # stopped: its hold is given back; its live workers count until they exit

    def held(self) -> int:
        return max(self.reserved, self.live)

    def extra(self) -> int:
        """Its workers above its hold (scale-outs into room no pool holds)."""
        return max(0, self.live - self.reserved)


class WorkerBudget:
    """Worker processes per pool and the node's limit (None: unbounded). Thread-safe: pools spawn
    and reap workers from their own threads; a deploy may wait here (never on the event loop)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._pools: dict[Any, _Held] = {}
        self._changed = threading.Condition()
        self._wanting: set[Any] = set()  # pools whose calls wait for room (`take` refused them)
        self._joining = 0                # deploys waiting in `join` for room

    @property
    def live(self) -> int:
        """Worker processes running on the node now (starting and stopping ones included)."""
        with self._changed:
            return sum(h.live for h in self._pools.values())

    def _held(self, skip: Collection[Any] = ()) -> int:
        return sum(h.held() for pool, h in self._pools.items() if pool not in skip)

    def join(self, pool: Any, reserved: int, *, replaces: Collection[Any] = (), wait: float = 0.0) -> str | None:
        """Hold `reserved` workers for `pool`; None, or why the node has no room (after waiting up to
        `wait` s for some, e.g. for a deleted function's workers to exit). `replaces`: pools this
        deploy replaces (their workers stop once it is committed). A pool joined already: None."""
        deadline = time.monotonic() + wait
        with self._changed:
            while pool not in self._pools:
                held = self._held(skip=replaces)
                if self.limit is None or held + reserved <= self.limit:
                    self._pools[pool] = _Held(reserved)
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return (f"this node's worker processes are taken (runtime.maxWorkerProcesses "
                            f"{self.limit}): {held} are held by other functions (max(minInstances, 1) "
                            f"each, or what they scaled out to), and this one needs {reserved}; retry once "
                            "they scale down, or lower minInstances; every process function holds one at least")
                self._joining += 1  # the others give back their idle workers above their hold
                try:
                    self._changed.wait(min(left, 0.1))
                finally:
                    self._joining -= 1
        return None

    def keep(self, pool: Any, reserved: int) -> None:
        """What the pool holds from now on (its code is imported: max(minInstances, 1))."""
        with self._changed:
            held = self._pools.get(pool)
            if held is not None and not held.left:
                held.reserved = reserved
            self._changed.notify_all()

    def leave(self, pool: Any) -> None:
        """The pool stopped: its hold is free; its workers count until they exit."""
        with self._changed:
            self._wanting.discard(pool)
            held = self._pools.get(pool)
            if held is not None:
                held.left, held.reserved = True, 0
                if held.live <= 0:
                    del self._pools[pool]
            self._changed.notify_all()

    def take(self, pool: Any) -> bool:
        """Count a worker `pool` is about to start: within its hold always; past it only while the
        node has room (False: not counted, not to be started)."""
        with self._changed:
            held = self._pools.get(pool)
            if held is None:
                held = self._pools[pool] = _Held(0)
            if held.live >= held.reserved and self.limit is not None and (
                    self._held() >= self.limit or self._joining > 0 or self._owed(pool, held.extra())):
                # Past its hold, only into free room no deploy, nor a function with fewer
                # scale-outs, waits for (what `yields` gave back goes to them).
                self._wanting.add(pool)
                return False
            self._wanting.discard(pool)
            held.live += 1
            return True

    def satisfied(self, pool: Any) -> None:
        """`pool` no longer waits for room (no call of it waits)."""
        with self._changed:
            self._wanting.discard(pool)

    def pressed(self, pool: Any) -> bool:
        """Whether another pool, or a deploy, waits for room: `pool` should stop its idle workers
        above its hold now."""
        with self._changed:
            return self._joining > 0 or bool(self._wanting - {pool})

    def _owed(self, pool: Any, extra: int) -> bool:
        """Another pool waits for room with fewer than `extra` workers above its hold."""
        return any(self._pools[w].extra() < extra for w in self._wanting if w is not pool and w in self._pools)

    def yields(self, pool: Any) -> bool:
        """Whether a busy worker of `pool` above its hold should exit after its current calls: a
        deploy waits for room, or another pool does with fewer workers above its own hold (one
        fewer would only move the contention back and forth)."""
        with self._changed:
            if self._joining > 0:
                return True
            own = self._pools.get(pool)
            return own is not None and self._owed(pool, own.extra() - 1)

    def ended(self, pool: Any) -> None:
        """A counted worker of `pool` exited (or never started)."""
        with self._changed:
            held = self._pools.get(pool)
            if held is not None:
                held.live -= 1
                if held.left and held.live <= 0:
                    del self._pools[pool]
            self._changed.notify_all()

    def room_for(self, pool: Any) -> float:
        """How many more workers `pool` could start now: what is left of its hold, plus the
        node's free room (inf: no limit)."""
        if self.limit is None:
            return float("inf")
        with self._changed:
            held = self._pools.get(pool)
            own = 0 if held is None else max(0, held.reserved - held.live)
            return own + max(0, self.limit - self._held())
