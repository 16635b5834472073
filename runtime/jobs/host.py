"""What the job manager's helpers (collect.py, recovery.py) use of it: a Protocol, so that they take
the manager (runtime/jobs/runner.py's JobManager) without importing the module that imports them."""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config import JobsConfig
    from ..dispatch import Dispatcher
    from ..errors import FunctionServiceError
    from ..surface import InvocationSurface
    from .limits import JobBytes
    from .model import Job, Status
    from .store import JobStore
    from .writes import StoreWrites

__all__ = ("JobHost",)


class JobHost(Protocol):
    config: JobsConfig
    dispatcher: Dispatcher  # refresh.py: the registry's code roots
    store: JobStore
    writes: StoreWrites
    bytes: JobBytes
    jobs: dict[str, Job]
    stopping: bool
    _running: dict[str, InvocationSurface]

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]: ...

    def _enqueue(self, job: Job, *, counted: bool = False) -> None: ...

    def _keep(self, job: Job) -> None: ...

    def _notify(self, job: Job) -> None: ...

    async def _finish(self, job: Job, status: Status, *, result: Any = None,
                      error: FunctionServiceError | None = None) -> None: ...
