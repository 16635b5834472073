"""The worker processes one node runs, across every process function (`runtime.maxWorkerProcesses`).

Deploys are checked against it for the workers they keep (runtime/quotas.py: minInstances summed),
but a function scales out under load up to its maxInstances: ten functions of 32 instances each
would start 320 processes. Every worker counts here while it lives; a pool scales out only while
the node is under the limit. Past it, a function's calls wait for a slot on the workers it has
(within their deadline), as they do at its maxInstances. Workers a function keeps (its minimum,
and their replacements) are never refused: the deploy quota counted them already.
"""
from __future__ import annotations

import threading

__all__ = ("WorkerBudget",)


class WorkerBudget:
    """A count of live worker processes and its limit (None: unbounded). Thread-safe: pools spawn
    and reap workers from their own threads."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.live = 0
        self._lock = threading.Lock()

    def take(self, *, scale_out: bool) -> bool:
        """Count a worker about to start; a scale-out only while under the limit (False: not counted)."""
        with self._lock:
            if scale_out and self.limit is not None and self.live >= self.limit:
                return False
            self.live += 1
            return True

    def ended(self) -> None:
        """A counted worker ended (or never started)."""
        with self._lock:
            self.live -= 1
