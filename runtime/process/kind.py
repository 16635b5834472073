"""`executor: process`: the handlers run in a per-function pool of Python worker processes
(runtime/executors.py registers it). Capacity and scaling are the pool's (`instanceConcurrency`
slots per worker, min/max instances); the ProcessExecutor starts each invocation on a worker and
enforces its timeout itself (a worker that will not stop is killed)."""
from __future__ import annotations

from ..executors import ExecutorKind
from .executor import ProcessExecutor
from .pool import WorkerPool

__all__ = ("PROCESS",)

PROCESS = ExecutorKind("process", in_process=False, own_deadline=True, runner=ProcessExecutor, pool=WorkerPool)
