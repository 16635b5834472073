"""Worker processes: run a function's handlers isolated, in parallel, with hard limits.

`WorkerPool` supervises one deployment's workers, `ProcessExecutor` runs invocations on them,
and `protocol` is the frame format both ends speak; `worker` is the process's main program.
"""
from .errors import MemoryLimitError, WorkerCrashedError, WorkerUnavailableError
from .executor import ProcessExecutor
from .pool import WorkerPool, WorkerProcess

__all__ = (
    "MemoryLimitError",
    "ProcessExecutor",
    "WorkerCrashedError",
    "WorkerPool",
    "WorkerProcess",
    "WorkerUnavailableError",
)
