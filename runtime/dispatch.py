"""The runtime's one entry point for running a function: `Dispatcher.dispatch`.

A route resolves who asks (a `Principal`, or None when auth is off), reads the event, and calls
`dispatch(principal, function, event, options)`. The dispatcher decides once where it runs: here
(the executor picks async, thread or process) or, in cluster mode, queued for a worker. Either
way the caller gets an InvocationSurface (runtime/surface.py) and only has to speak HTTP.
The tenant check (runtime/principal.py) runs here too, so no route can forget it.

Background jobs (runtime/jobs) take the same door: `submit_job` checks the tenant and hands the
job to the node's job manager, which runs it later through `dispatch` (with a job's options:
its own timeout, generator items kept as values).

Extension points: `InvokeOptions` grows fields for new kinds of invocation (e.g. `session`: an
X-Instance-Session turn, runtime/sessions.py), and `Principal`
(runtime/principal.py) is the value tenant scoping keys on.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .deployment import Deployment, FunctionRef
from .errors import FunctionNotFoundError, ServiceUnavailableError
from .executor import Executor
from .invocation import Invocation
from .plain import PlainCall
from .principal import Principal, check_tenant
from .registry import Registry
from .sessions import SessionRequest
from .surface import InvocationSurface, Mode

if TYPE_CHECKING:
    from .config import Config
    from .jobs.model import Job, JobRequest

__all__ = ("InvokeOptions", "Limits", "Dispatcher", "ClusterRoute", "JobQueue")


class InvokeOptions(NamedTuple):
    """How to run one invocation (a tuple: immutable, and made per request at half a frozen
    dataclass's cost)."""

    mode: Mode = "json"
    trace_id: str | None = None
    # A plain JSON call of an in-process handler may run in the caller's own task (Executor.start).
    inline: bool = False
    # An X-Instance-Session turn: run within the function's session of that id (opened if new). Only
    # an invocation run here has one; one queued for another cluster node is not pinned.
    session: SessionRequest | None = None
    # Seconds, when shorter than the function's timeout (a job's policy.executionTimeout).
    timeout: float | None = None
    # Streaming generator items reach the channel as `Item`s with their values (a job's output).
    keep_items: bool = False
    # Work already accepted (a stored job): queued for the cluster, a Redis outage is waited out
    # within the deadline instead of answered 503 at once (a caller that waits gets that 503).
    accepted: bool = False
    # The invocation's id when it was named before it ran (a job's, answered at submit time).
    invocation_id: str | None = None


_PLAIN_KINDS = frozenset(("async", "sync"))  # handlers a plain call runs (not generators)

PLAIN = InvokeOptions()  # a plain JSON call with the function's own settings


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-invocation bounds (frontend.args): output buffer (events, bytes), one write, the whole answer."""

    buffer_events: int = 100
    max_write_size: int = 4 * 1024 * 1024
    max_response_size: int = 6 * 1024 * 1024
    buffer_bytes: int | None = None

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        args = config.frontend.args
        return cls(args.streamBufferEvents, args.maxWriteSize, args.maxResponseSize, args.streamBufferBytes)


class ClusterRoute(Protocol):
    """What dispatch asks of a cluster node (runtime/cluster/node.py ClusterNode): the functions the
    cluster knows that this node cannot load. (Running a call on the cluster is the remote kind's
    forwarder's, runtime/cluster/kind.py, which the Executor holds.)"""

    def lookup(self, ref: str, tenant: str | None) -> FunctionRef: ...


class JobQueue(Protocol):
    """What dispatch asks of the node's job manager (runtime/jobs/runner.py JobManager)."""

    async def submit(self, function: FunctionRef, event: Any, request: JobRequest) -> Job: ...


class Dispatcher:
    """Finds functions and runs invocations, here or on the cluster."""

    def __init__(self, registry: Registry, executor: Executor, limits: Limits = Limits(),
                 cluster: ClusterRoute | None = None, jobs: Callable[[Dispatcher], JobQueue] | None = None) -> None:
        """`cluster`: the node's cluster membership (cluster mode); `jobs` makes the node's job queue,
        which runs its jobs through this dispatcher (runtime/node.py builds both)."""
        self.registry = registry
        self.executor = executor
        self.limits = limits
        self.cluster = cluster
        self.jobs = None if jobs is None else jobs(self)

    def find(self, principal: Principal | None, ref: str) -> FunctionRef:
        """The function `ref` names in the principal's tenant, deployed here or (cluster mode) known
        to the cluster; 404 otherwise, another tenant's function included."""
        function: FunctionRef
        tenant = None if principal is None else principal.tenant  # names are per tenant (any role)
        try:
            function = self.registry.get(ref, tenant)
        except FunctionNotFoundError:
            if self.cluster is None:
                raise
            function = self.cluster.lookup(ref, tenant)
        return function

    async def dispatch(self, principal: Principal | None, function: FunctionRef | str, event: Any,
                       options: InvokeOptions = PLAIN) -> InvocationSurface:
        """Start `function` with `event`; the running invocation, to read and await."""
        if isinstance(function, str):
            function = self.find(principal, function)
        else:
            check_tenant(principal, function.spec)
        limits = self.limits
        forwarder = self.executor.forwarder_of(function)   # another node runs it (remote: cluster mode)
        if forwarder is not None:
            surface: InvocationSurface = await forwarder.submit(function, event, options, limits)
            return surface
        assert isinstance(function, Deployment)  # a RemoteFunction is always taken by the remote kind
        inv = Invocation(function, event, mode=options.mode, loop=asyncio.get_running_loop(),
                         buffer_events=limits.buffer_events, max_write_size=limits.max_write_size,
                         max_response_size=limits.max_response_size, trace_id=options.trace_id,
                         timeout=options.timeout, keep_items=options.keep_items,
                         buffer_bytes=limits.buffer_bytes, invocation_id=options.invocation_id)
        if options.session is not None:
            inv.session = function.sessions.open(options.session)  # 429 when the table is full
        self.executor.start(inv, inline=options.inline)
        return inv

    def plain(self, principal: Principal | None, function: FunctionRef, event: Any,
              trace_id: str) -> PlainCall | None:
        """A plain JSON call of `function` (runtime/plain.py), to run with `Executor.call_plain`
        in the caller's task; None when the call must take `dispatch` instead: a function queued
        for the cluster or run by worker processes, a generator handler, one not yet initialized.
        The tenant check is dispatch's."""
        check_tenant(principal, function.spec)
        if type(function) is not Deployment or function.kind not in _PLAIN_KINDS or not function.ready:
            return None
        if not function.in_process:  # its kind's runner (worker processes) runs it
            return None
        if self.executor.forwarder_of(function) is not None:   # another node runs it
            return None
        limits = self.limits
        return PlainCall(function, event, trace_id, limits.max_write_size, limits.max_response_size)

    async def submit_job(self, principal: Principal | None, function: FunctionRef | str, event: Any,
                         request: JobRequest) -> Job:
        """Store a background job of `function` (it runs later, through `dispatch`); the job, once stored."""
        if isinstance(function, str):
            function = self.find(principal, function)
        else:
            check_tenant(principal, function.spec)
        if self.jobs is None:
            raise ServiceUnavailableError("this node runs no background jobs")
        return await self.jobs.submit(function, event, request)
