"""The function registry: deploy, redeploy and delete function services.

A Deployment is immutable once registered; a redeploy registers a new one, so invocations in
flight finish on the code they started with while new invocations get the new code.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from .errors import ConcurrencyLimitError, DeployError, FunctionNotFoundError, InitializerError
from .loader import LoadedCode, load_code
from .manifest import FunctionSpec
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
    """A deployed function: its spec, its loaded code and its live counters."""

    def __init__(self, spec: FunctionSpec, code: LoadedCode, revision: int) -> None:
        self.spec = spec
        self.code = code
        self.kind: Kind = handler_kind(code.handler)
        self.executor: ExecutorName = executor_for(spec, self.kind)
        self.pool: WorkerPool | None = None  # executor: process - started by Registry.deploy
        self.revision = revision
        self.inflight = 0
        self.invocations = 0
        self.failures = 0
        self._init_lock = asyncio.Lock()
        self._initialized = code.initializer is None
        self.init_error: str | None = None

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

    def release(self) -> None:
        self.inflight -= 1

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
        return data


class Registry:
    """Name -> Deployment. Deploys are all-or-nothing across the specs given."""

    def __init__(self, code_roots: Iterable[Path] = ()) -> None:
        self.code_roots = [Path(p).resolve() for p in code_roots]
        self._deployments: dict[str, Deployment] = {}
        self._revision = 0
        self.on_change: list[Callable[[str, Deployment | None], None]] = []

    def __contains__(self, name: str) -> bool:
        return name in self._deployments

    def __len__(self) -> int:
        return len(self._deployments)

    def list(self) -> list[Deployment]:
        return sorted(self._deployments.values(), key=lambda d: d.name)

    def deploy(self, specs: list[FunctionSpec], *, replace: bool = True) -> list[Deployment]:
        """Load every spec's code first; register only if all loaded (nothing partial)."""
        if not replace:
            existing = [s.name for s in specs if s.name in self._deployments]
            if existing:
                raise DeployError(f"function(s) already deployed: {', '.join(existing)}; use PUT to redeploy",
                                  code=200409, status=409)
        loaded = [(spec, load_code(spec, self.code_roots)) for spec in specs]
        for spec, code in loaded:
            executor_for(spec, handler_kind(code.handler))  # refuse a clash before registering anything
        out = []
        for spec, code in loaded:
            self._revision += 1
            dep = Deployment(spec, code, self._revision)
            if dep.executor == "process":
                dep.pool = WorkerPool(dep, self.code_roots, instances=spec.instances)
                dep.pool.start()
            old = self._deployments.get(spec.name)
            if old is not None and old.pool is not None:
                old.pool.stop()  # its busy workers finish their invocation on the old code first
            self._deployments[spec.name] = dep
            out.append(dep)
            log.info("deployed %s (%s, %s handler, revision %d)", spec.name, spec.urn, dep.kind, dep.revision)
            for cb in self.on_change:
                cb(spec.name, dep)
        return out

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
        if dep.pool is not None:
            dep.pool.stop()  # runs preStop in each worker
        log.info("deleted %s", name)
        for cb in self.on_change:
            cb(name, None)
        return dep

    async def stop_workers(self, grace: float = 10.0) -> None:
        """Stop every worker pool (preStop runs; busy workers get `grace` seconds), for shutdown."""
        pools = [d.pool for d in self._deployments.values() if d.pool is not None]
        await asyncio.gather(*(p.aclose(grace) for p in pools))
