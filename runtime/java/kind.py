"""Java functions (`runtime: java`): a pool of worker JVMs speaking the process workers' frame
protocol, so the ProcessExecutor runs their invocations (runtime/executors.py registers it; a
manifest does not name it: `runtime: java` does)."""
from __future__ import annotations

from ..executors import ExecutorKind
from ..process.executor import ProcessExecutor
from .pool import JavaWorkerPool

__all__ = ("JAVA",)

JAVA = ExecutorKind("java", in_process=False, own_deadline=True, selectable=False, runner=ProcessExecutor,
                    pool=JavaWorkerPool)
