"""The function registry: deploy, redeploy and delete function services.

A Deployment is immutable once registered; a redeploy registers a new one, so invocations in
flight finish on the code they started with while new invocations get the new code. A deployment
that is replaced or deleted is stopped: its preStop runs once its invocations have finished (or
after `stop_grace` seconds). The code of an `executor: process` function is never imported in the
server: its first worker process imports it, and the deploy fails with that worker's message.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from .errors import ConcurrencyLimitError, DeployError, FunctionNotFoundError, InitializerError
from .limits import ThreadGate
from .loader import LoadedCode, check_code_location, load_code
from .manifest import FunctionSpec
from .pre_stop import run_pre_stop
from .process.pool import WorkerPool

__all__ = ("Deployment", "Registry", "handler_kind", "parse_function_ref", "executor_for")

log = logging.getLogger("fnstream.runtime")

Kind = Literal["async", "sync", "gen", "asyncgen"]
ExecutorName = Literal["async", "thread", "process"]
_URN_RE = re.compile(r"^sn:cn:yrk:(?P<tenant>[^:]+):function:0@(?P<namespace>[^@]+)@(?P<name>[^:]+):(?P<version>[^:]+)$")


def handler_kind(func: Callable) -> Kind:
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


class Deployment:
    """A deployed function: its spec, its loaded code and its live counters.

    `code` is None for `executor: process`: the workers hold the code, and `kind` is what the
    first worker reported once it had imported it.
    """

    def __init__(self, spec: FunctionSpec, code: LoadedCode | None, revision: int = 0) -> None:
        self.spec = spec
        self.code = code
        self.kind: Kind = handler_kind(code.handler) if code is not None else "sync"
        self.executor: ExecutorName = "process" if code is None else executor_for(spec, self.kind)
        self.pool: WorkerPool | None = None  # executor: process - started by Registry.deploy
        self.thread_gate: ThreadGate | None = None  # `def` handlers: set by the Executor on first call
        self.revision = revision
        self.inflight = 0
        self.invocations = 0
        self.failures = 0
        self._init_lock = asyncio.Lock()
        self._initialized = code is None or code.initializer is None
        self.init_error: str | None = None
        self.pre_stop_started = False
        self._idle = asyncio.Event()  # set whenever no invocation is in flight (awaited on stop)
        self._idle.set()

    @property
    def name(self) -> str:
        return self.spec.name

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

    async def stop(self, grace: float) -> None:
        """In-process code: wait up to `grace` s for the invocations in flight, then run preStop.

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
        await run_pre_stop(self)

    async def ensure_initialized(self, run_sync: Callable[[Callable[[], Any]], Any]) -> None:
        """Run the initializer once; if it failed, every invocation fails with 4201."""
        if not self._initialized:
            async with self._init_lock:
                if not self._initialized:
                    from .context import Context
                    init = self.code.initializer
                    assert init is not None
                    ctx = Context(self)
                    try:
                        if inspect.iscoroutinefunction(init):
                            await asyncio.wait_for(init(ctx), self.spec.timeout)
                        else:
                            await asyncio.wait_for(run_sync(lambda: init(ctx)), self.spec.timeout)
                    except Exception as exc:  # noqa: BLE001 - user code
                        self.init_error = f"initializer failed: {type(exc).__name__}: {exc}"
                        log.exception("function %s: initializer failed", self.name)
                    self._initialized = True
        if self.init_error is not None:
            raise InitializerError(self.init_error)

    def describe(self) -> dict:
        data = self.spec.public()
        data["status"] = {"revision": self.revision, "kind": self.kind, "inflight": self.inflight,
                          "invocations": self.invocations, "failures": self.failures,
                          "initError": self.init_error, "executor": self.executor}
        if self.pool is not None:
            data["status"]["pool"] = self.pool.describe()
        if self.thread_gate is not None:
            data["status"]["threads"] = self.thread_gate.describe()
            if self.thread_gate.overran_total:
                data["status"]["warning"] = ("threads of this function ran past their timeout and cannot be "
                                             "stopped: use 'executor: process' for code that must be stoppable")
        return data


class Registry:
    """Name -> Deployment. Deploys are all-or-nothing across the specs given."""

    def __init__(self, code_roots: Iterable[Path] = (), *, stop_grace: float = 10.0) -> None:
        self.code_roots = [Path(p).resolve() for p in code_roots]
        self.stop_grace = stop_grace  # how long a replaced/deleted deployment's invocations may run on
        self._deployments: dict[str, Deployment] = {}
        self._revision = 0
        self._stopping: dict[Deployment, "asyncio.Task[None]"] = {}  # replaced/deleted, preStop pending
        self.on_change: list[Callable[[str, Deployment | None], None]] = []

    def __contains__(self, name: str) -> bool:
        return name in self._deployments

    def __len__(self) -> int:
        return len(self._deployments)

    def list(self) -> list[Deployment]:
        return sorted(self._deployments.values(), key=lambda d: d.name)

    # -- deploy --------------------------------------------------------------------------------
    def deploy(self, specs: list[FunctionSpec], *, replace: bool = True) -> list[Deployment]:
        """Deploy all of `specs` or none; waits on this thread for process workers to import.

        For start-up and other synchronous callers; request handlers use `adeploy`.
        """
        staged = self._stage(specs, replace)
        self._await_imports(staged)
        return self._commit(staged, replace)

    async def adeploy(self, specs: list[FunctionSpec], *, replace: bool = True) -> list[Deployment]:
        """`deploy` for the event loop: the wait for worker processes' imports runs in a thread."""
        staged = self._stage(specs, replace)
        waiting = asyncio.ensure_future(asyncio.to_thread(self._await_imports, staged))
        try:
            await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The thread cannot be interrupted: once it is done, stop the workers nothing will use.
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception() or self._abort(staged))
            raise
        return self._commit(staged, replace)

    def _check_absent(self, specs: list[FunctionSpec]) -> None:
        existing = [s.name for s in specs if s.name in self._deployments]
        if existing:
            raise DeployError(f"function(s) already deployed: {', '.join(existing)}; use PUT to redeploy",
                              code=200409, status=409)

    def _stage(self, specs: list[FunctionSpec], replace: bool) -> list[Deployment]:
        """Import in-process code here; start the first worker of each process function."""
        if not replace:
            self._check_absent(specs)
        # In-process code first (a kind/executor clash raises here), before any worker is started.
        loaded = [Deployment(spec, load_code(spec, self.code_roots)) if spec.executor != "process" else None
                  for spec in specs]
        for spec in specs:
            if spec.executor == "process":
                check_code_location(spec, self.code_roots)
        staged: list[Deployment] = []
        try:
            for spec, dep in zip(specs, loaded):
                if dep is None:
                    dep = Deployment(spec, None)
                    dep.pool = WorkerPool(dep, self.code_roots, instances=spec.instances)
                    dep.pool.start()
                staged.append(dep)
        except BaseException:
            self._abort(staged)
            raise
        return staged

    def _await_imports(self, staged: list[Deployment]) -> None:
        """Wait for each process function's first worker to import its code (DeployError if not)."""
        try:
            for dep in staged:
                if dep.pool is not None:
                    dep.kind = dep.pool.wait_loaded()  # type: ignore[assignment]
        except BaseException:
            self._abort(staged)
            raise

    @staticmethod
    def _abort(staged: list[Deployment]) -> None:
        for dep in staged:
            if dep.pool is not None:
                dep.pool.abort() if not dep.pool.validated else dep.pool.stop()

    def _commit(self, staged: list[Deployment], replace: bool) -> list[Deployment]:
        if not replace:
            try:
                self._check_absent([dep.spec for dep in staged])  # another deploy got there meanwhile
            except DeployError:
                self._abort(staged)
                raise
        for dep in staged:
            self._revision += 1
            dep.revision = self._revision
            old = self._deployments.get(dep.name)
            self._deployments[dep.name] = dep
            if old is not None:
                self._retire(old)
            log.info("deployed %s (%s, %s handler, %s executor, revision %d)",
                     dep.name, dep.spec.urn, dep.kind, dep.executor, dep.revision)
            if dep.executor != "process" and "memory" in dep.spec.model_fields_set:
                log.warning("function %s: 'memory: %d' is not enforced for the %s executor (only "
                            "'executor: process' limits memory); the handler shares the server's memory",
                            dep.name, dep.spec.memory, dep.executor)
            for cb in self.on_change:
                cb(dep.name, dep)
        return staged

    # -- stop ----------------------------------------------------------------------------------
    def _retire(self, dep: Deployment) -> None:
        """Stop a deployment that was replaced or deleted: its preStop runs after its invocations."""
        if dep.pool is not None:
            dep.pool.stop(self.stop_grace)  # busy workers finish their invocation, then run preStop
            return
        if dep.code is None or dep.code.pre_stop is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a synchronous caller with no loop: nothing can be in flight
            asyncio.run(dep.stop(0))
            return
        task = loop.create_task(dep.stop(self.stop_grace), name=f"prestop-{dep.name}-{dep.revision}")
        self._stopping[dep] = task
        task.add_done_callback(lambda _t: self._stopping.pop(dep, None))

    def get(self, ref: str) -> Deployment:
        parts = parse_function_ref(ref)
        dep = self._deployments.get(parts["name"] or "")
        if dep is None:
            raise FunctionNotFoundError(f"function {ref!r} is not deployed")
        spec = dep.spec
        for key in ("tenant", "namespace", "version"):
            want = parts[key]
            if want is not None and want != getattr(spec, key) and not (key == "version" and want == "latest"):
                raise FunctionNotFoundError(f"function {ref!r} is not deployed "
                                            f"({key} is {getattr(spec, key)!r}, not {want!r})")
        return dep

    def delete(self, name: str) -> Deployment:
        dep = self._deployments.pop(name, None)
        if dep is None:
            raise FunctionNotFoundError(f"function {name!r} is not deployed")
        self._retire(dep)
        log.info("deleted %s", name)
        for cb in self.on_change:
            cb(name, None)
        return dep

    async def stop_workers(self, grace: float | None = None) -> None:
        """Shutdown (after `Executor.drain`): run every deployment's preStop and stop every pool.

        In-process preStops of replaced/deleted deployments stop waiting for their invocations:
        the drain already gave those their grace.
        """
        grace = self.stop_grace if grace is None else grace
        current = list(self._deployments.values())
        for dep in self._stopping:
            dep._idle.set()
        pending = list(self._stopping.values())
        await asyncio.gather(
            *pending,
            *(dep.pool.aclose(grace) for dep in current if dep.pool is not None),
            *(dep.stop(0) for dep in current if dep.pool is None),
            return_exceptions=True)
