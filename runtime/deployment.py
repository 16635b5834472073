"""A deployed function and the rules that shape it: handler kind, executor, function references.

Below the registry and above the code that runs invocations: the registry makes Deployments,
the executors run them, and nothing here imports the registry, the process pool (only its type)
or the cluster. The worker process imports `handler_kind` from here without pulling in its
own supervisor.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import ConcurrencyLimitError, DeployError, FunctionNotFoundError, InitializerError
from .executors import ExecutorKind, kind_named, kind_of
from .loader import LoadedCode
from .manifest import FunctionSpec
from .pre_stop import run_pre_stop
from .sessions import SessionTable

if TYPE_CHECKING:
    from .limits import ThreadGate
    from .process.pool import WorkerPool

__all__ = ("Deployment", "RemoteFunction", "FunctionRef", "Kind", "ExecutorName", "handler_kind", "executor_for",
           "parse_function_ref", "check_ref", "function_key", "DEFAULT_TENANT")

log = logging.getLogger("fnstream.runtime")

Kind = Literal["async", "sync", "gen", "asyncgen"]
ExecutorName = str  # a name of runtime/executors.py KINDS
_URN_RE = re.compile(r"^sn:cn:yrk:(?P<tenant>[^:]+):function:0@(?P<namespace>[^@]+)@(?P<name>[^:]+)"
                     r":(?P<version>[^:]+)$")


DEFAULT_TENANT = "default"  # a manifest's `tenant` when it names none (runtime/manifest.py)


def function_key(tenant: str, name: str) -> str:
    """What a function is known by: names belong to their tenant, so the key is `tenant/name`.

    The default tenant's functions keep their bare name as key: deployments stored, Redis records,
    queues and worker announcements made before names were per tenant stay valid. Neither a tenant
    id nor a name holds `/` (manifest rules), so a key names one (tenant, name) pair.
    """
    return name if tenant == DEFAULT_TENANT else f"{tenant}/{name}"


def handler_kind(func: Callable[..., Any]) -> Kind:
    if inspect.isasyncgenfunction(func):
        return "asyncgen"
    if inspect.iscoroutinefunction(func):
        return "async"
    if inspect.isgeneratorfunction(func):
        return "gen"
    return "sync"


def executor_for(spec: FunctionSpec, kind: Kind) -> ExecutorName:
    """The manifest's `executor`, or the default for the handler's kind; DeployError if they clash."""
    is_async = kind in ("async", "asyncgen")
    if spec.executor is None:
        return "async" if is_async else "thread"
    if spec.executor == "async" and not is_async:
        raise DeployError(f"function {spec.name!r}: field 'executor': 'async' needs an `async def` handler")
    if spec.executor == "thread" and is_async:
        raise DeployError(f"function {spec.name!r}: field 'executor': 'thread' needs a plain `def` handler "
                          "(use 'async' or 'process')")
    return spec.executor


def parse_function_ref(ref: str) -> dict[str, str | None]:
    """`name`, `name:version` or a full URN -> {tenant, namespace, name, version} (None = any)."""
    m = _URN_RE.match(ref)
    if m:
        return m.groupdict()
    name, _, version = ref.partition(":")
    return {"tenant": None, "namespace": None, "name": name, "version": version or None}


def check_ref(ref: str, parts: dict[str, str | None], spec: FunctionSpec) -> None:
    """FunctionNotFoundError unless the tenant, namespace and version `ref` names are `spec`'s."""
    for key in ("tenant", "namespace", "version"):
        want = parts[key]
        have = getattr(spec, key)
        if want is not None and want != have and key == "tenant":
            raise FunctionNotFoundError(f"function {ref!r} is not deployed")  # nothing of another tenant shown
        if want is not None and want != have and not (key == "version" and want == "latest"):
            raise FunctionNotFoundError(f"function {ref!r} is not deployed ({key} is {have!r}, not {want!r})")


@dataclass(frozen=True, slots=True)
class RemoteFunction:
    """A function the cluster serves but this node cannot load: it can only be queued for a worker."""

    spec: FunctionSpec
    unavailable: str  # why this node cannot load it
    in_process = False  # queued for the cluster's worker nodes (runtime/cluster/kind.py)

    @property
    def runs(self) -> ExecutorKind:
        return kind_named("remote")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def key(self) -> str:
        return function_key(self.spec.tenant, self.spec.name)


class Deployment:
    """A deployed function: its spec, its loaded code and its live counters.

    `code` is None for `executor: process`: the workers hold the code, and `kind` is what the
    first worker reported once it had imported it.
    """

    def __init__(self, spec: FunctionSpec, code: LoadedCode | None, revision: int = 0) -> None:
        wanted = code.runpod.concurrency if code is not None and code.runpod is not None else None
        if wanted is not None and "concurrency" not in spec.model_fields_set:
            spec = spec.model_copy(update={"concurrency": wanted})  # RunPod's concurrency_modifier
        self.spec = spec
        self.code = code
        self.kind: Kind = handler_kind(code.handler) if code is not None else "sync"
        self.executor: ExecutorName = "process" if code is None else executor_for(spec, self.kind)
        # Where its invocations run (runtime/executors.py): the manifest's kind, `java` for a Java function.
        self.runs: ExecutorKind = kind_of(spec) or kind_named(self.executor)
        self.in_process = self.runs.in_process  # read per call: the Executor runs it (loop or thread)
        self.pool: WorkerPool | None = None  # executor: process - started by Registry.deploy
        self.sessions = SessionTable()  # X-Instance-Session sessions of this deployment
        self.thread_gate: ThreadGate | None = None  # `def` handlers: set by the Executor on first call
        self.revision = revision
        self.inflight = 0
        self.invocations = 0
        self.failures = 0
        self._init_lock = asyncio.Lock()
        self._initialized = code is None or code.initializer is None
        self._init_error: str | None = None
        self.pre_stop_started = False
        self._idle = asyncio.Event()  # set whenever no invocation is in flight (awaited on stop)
        self._idle.set()
        # Called after each slot is given back (a cluster worker reads a full function's queue again).
        self.on_release: Callable[[], None] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def key(self) -> str:
        """`function_key` of its tenant and name (the registry's, the store's and the cluster's key)."""
        return function_key(self.spec.tenant, self.spec.name)

    @property
    def runpod_aggregates(self) -> bool | None:
        """The code's runpod.serverless.start() return_aggregate_stream; None without such a call."""
        if self.code is not None:
            return None if self.code.runpod is None else self.code.runpod.aggregate_stream
        options = self.pool.runpod if self.pool is not None else None
        return None if options is None else bool(options.get("aggregate_stream"))

    @property
    def init_error(self) -> str | None:
        """Why the initializer failed (here, or in the pool's workers); every invocation fails with 4201."""
        if self._init_error is None and self.pool is not None:
            return self.pool.init_error
        return self._init_error

    def acquire(self) -> None:
        """Take a concurrency slot or fail with 429."""
        if self.inflight >= self.spec.concurrency:
            raise ConcurrencyLimitError(f"function {self.name!r} is at its concurrency limit "
                                        f"({self.spec.concurrency}); retry later")
        self.inflight += 1
        self.invocations += 1
        self._idle.clear()

    def release(self) -> None:
        self.inflight -= 1
        if self.inflight <= 0:
            self._idle.set()
        if self.on_release is not None:
            self.on_release()

    def stop_waiting(self) -> None:
        """Let a pending `stop` run its preStop now (shutdown: the drain already gave the grace)."""
        self._idle.set()

    async def stop(self, grace: float, pre_stop_grace: float | None = None) -> None:
        """In-process code: wait up to `grace` s for the invocations in flight, then run preStop once
        (within `pre_stop_grace`: runtime/pre_stop.py).

        A thread cannot be stopped: one still running after the grace keeps running beside preStop.
        """
        if self.code is None or self.code.pre_stop is None or self.pre_stop_started:
            return
        if self.inflight > 0:
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                log.warning("function %s: running preStop with %d invocation(s) of revision %d still in flight",
                            self.name, self.inflight, self.revision)
        if self._take_pre_stop():  # not if a concurrent stop() took it during the wait
            await run_pre_stop(self.spec, self.code.pre_stop, self.revision, pre_stop_grace)

    def replace_code(self, code: LoadedCode) -> None:
        """A fresh instance of the same code (RunPod's refresh_worker): its initializer runs again."""
        self.code = code
        self._initialized = code.initializer is None
        self._init_error = None

    def _take_pre_stop(self) -> bool:
        taken, self.pre_stop_started = not self.pre_stop_started, True
        return taken

    @property
    def ready(self) -> bool:
        """The initializer ran (or there is none) and did not fail: `ensure_initialized` has nothing to do."""
        return self._initialized and self._init_error is None

    async def ensure_initialized(self, run_sync: Callable[[Callable[[], Any]], asyncio.Future[Any]]) -> None:
        """Run the initializer once; if it failed, every invocation fails with 4201."""
        if not self._initialized:
            async with self._init_lock:
                if not self._initialized:
                    from .context import Context
                    assert self.code is not None and self.code.initializer is not None
                    init = self.code.initializer
                    ctx = Context(self.spec)
                    try:
                        if inspect.iscoroutinefunction(init):
                            await asyncio.wait_for(init(ctx), self.spec.timeout)
                        else:
                            await asyncio.wait_for(run_sync(lambda: init(ctx)), self.spec.timeout)
                    except Exception as exc:
                        self._init_error = f"initializer failed: {type(exc).__name__}: {exc}"
                        log.exception("function %s: initializer failed", self.name)
                    self._initialized = True
        if self._init_error is not None:
            raise InitializerError(self._init_error)

    def describe(self) -> dict[str, Any]:
        data = self.spec.public()
        data["status"] = {"revision": self.revision, "kind": self.kind, "inflight": self.inflight,
                          "invocations": self.invocations, "failures": self.failures,
                          "initError": self.init_error, "executor": self.executor,
                          "sessions": self.sessions.describe()}
        if self.pool is not None:
            data["status"]["pool"] = self.pool.describe()
        if self.thread_gate is not None:
            data["status"]["threads"] = self.thread_gate.describe()
            if self.thread_gate.overran_total:
                data["status"]["warning"] = ("threads of this function ran past their timeout and cannot be "
                                             "stopped: use 'executor: process' for code that must be stoppable")
        return data


FunctionRef = Deployment | RemoteFunction
