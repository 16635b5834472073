"""The function registry: deploy, redeploy and delete function services.

A Deployment is immutable once registered; a redeploy registers a new one, so invocations in
flight finish on the code they started with while new invocations get the new code. A deployment
that is replaced or deleted is stopped: its preStop runs once its invocations have finished (or
after `stop_grace` seconds), within `pre_stop_grace` of its own. The code of an `executor: process`
function is never imported in the server: its first worker process imports it, and the deploy
fails with that worker's message.

Names belong to their tenant: deployments are keyed by (tenant, name) (`function_key`), so two
tenants each have their own `fc`, and a lookup for one tenant never finds, nor tells of, another's.
"""
from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from .deployment import DEFAULT_TENANT, Deployment, check_ref, function_key, parse_function_ref
from .errors import DeployError, FunctionNotFoundError, FunctionServiceError
from .executors import kind_of
from .heap import thaw
from .loader import check_code_location, load_code
from .manifest import FunctionSpec
from .process.budget import WorkerBudget
from .quotas import QuotaError, Quotas

__all__ = ("Registry",)

log = logging.getLogger("fnstream.runtime")

# A deploy waits this long for room on the node (runtime.maxWorkerProcesses), e.g. for the workers
# of a function just deleted to exit, before it is refused 429.
ROOM_WAIT = 5.0


class Registry:
    """(tenant, name) -> Deployment. Deploys are all-or-nothing across the specs given."""

    def __init__(self, code_roots: Iterable[Path] = (), *, stop_grace: float = 10.0, pre_stop_grace: float = 10.0,
                 quotas: Quotas | None = None) -> None:
        self.code_roots = [Path(p).resolve() for p in code_roots]
        self.quotas = quotas or Quotas()  # checked before anything is imported or started, and again at commit
        self.workers = WorkerBudget(self.quotas.max_worker_processes)  # no worker starts past the node's limit
        self.stop_grace = stop_grace  # how long a replaced/deleted deployment's invocations may run on
        self.pre_stop_grace = pre_stop_grace  # how long preStop hooks may run then (and at shutdown)
        self._deployments: dict[str, Deployment] = {}  # function_key(tenant, name) -> deployment
        self._tenants_of: dict[str, set[str]] = {}  # name -> tenants deploying it (auth-off lookups)
        self._revision = 0
        self._stopping: dict[Deployment, asyncio.Task[None]] = {}  # replaced/deleted, preStop pending
        self.on_change: list[Callable[[str, Deployment | None], None]] = []  # (key, deployment or None)

    def __contains__(self, key: str) -> bool:
        """Whether `key` (`function_key(tenant, name)`; a bare name: the default tenant's) is deployed."""
        return key in self._deployments

    def __len__(self) -> int:
        return len(self._deployments)

    def list(self) -> list[Deployment]:
        return sorted(self._deployments.values(), key=lambda d: (d.name, d.spec.tenant))

    # -- deploy --------------------------------------------------------------------------------
    def deploy(self, specs: builtins.list[FunctionSpec], *, replace: bool = True) -> builtins.list[Deployment]:
        """Deploy all of `specs` or none; waits on this thread for process workers to import.

        For start-up and other synchronous callers; request handlers use `adeploy`.
        """
        return self._commit(self._stage_and_import(specs, replace), replace)

    async def adeploy(self, specs: builtins.list[FunctionSpec], *, replace: bool = True) -> builtins.list[Deployment]:
        """`deploy` for the event loop: importing in-process code (file reads, the module's own
        top-level code) and the wait for worker processes' imports run in a thread."""
        waiting = asyncio.ensure_future(asyncio.to_thread(self._stage_and_import, specs, replace))
        try:
            staged = await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The thread cannot be interrupted: once it is done, stop the workers nothing will use.
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception() or self._abort(f.result()))
            raise
        return self._commit(staged, replace)

    def _stage_and_import(self, specs: builtins.list[FunctionSpec], replace: bool) -> builtins.list[Deployment]:
        staged = self._stage(specs, replace)
        self._await_imports(staged)
        return staged

    def _check_absent(self, specs: builtins.list[FunctionSpec]) -> None:
        existing = [s.name for s in specs if function_key(s.tenant, s.name) in self._deployments]
        if existing:
            raise DeployError(f"function(s) already deployed: {', '.join(existing)}; use PUT to redeploy",
                              code=200409, status=409)

    def _stage(self, specs: builtins.list[FunctionSpec], replace: bool) -> builtins.list[Deployment]:
        """Import in-process code here; start the first worker of each process function."""
        if not replace:
            self._check_absent(specs)
        self._check_quotas(specs)
        # In-process code first (a kind/executor clash raises here), before any worker is started.
        kinds = [kind_of(spec) for spec in specs]  # None: in process, async or thread by the handler's kind
        loaded = [Deployment(spec, load_code(spec, self.code_roots)) if kind is None or kind.in_process else None
                  for spec, kind in zip(specs, kinds, strict=True)]
        for spec, kind in zip(specs, kinds, strict=True):
            if kind is not None and kind.pooled:
                check_code_location(spec, self.code_roots)
        staged: builtins.list[Deployment] = []
        replaced = {old.pool for old in (self._deployments.get(function_key(s.tenant, s.name)) for s in specs)
                    if old is not None and old.pool is not None}  # their workers stop once this commits
        try:
            for spec, dep in zip(specs, loaded, strict=True):
                if dep is None:  # a pooled kind: its pool's first worker imports the code
                    dep = Deployment(spec, None)
                    assert dep.runs.pool is not None
                    pool = dep.runs.pool(spec, self.code_roots, budget=self.workers)
                    why = self.workers.join(pool, pool.reserved(), replaces=replaced, wait=ROOM_WAIT)
                    if why is not None:
                        raise QuotaError(f"function {spec.name!r}: {why}")
                    dep.pool = pool
                    try:
                        pool.start()
                    except BaseException:
                        pool.abort()  # gives back what it holds on the node
                        raise
                staged.append(dep)
        except BaseException:
            self._abort(staged)
            raise
        return staged

    def _await_imports(self, staged: builtins.list[Deployment]) -> None:
        """Wait for each process function's first worker to import its code (DeployError if not)."""
        try:
            for dep in staged:
                if dep.pool is not None:
                    dep.kind = dep.pool.wait_loaded()  # type: ignore[assignment]
        except BaseException:
            self._abort(staged)
            raise

    @staticmethod
    def _abort(staged: builtins.list[Deployment]) -> None:
        for dep in staged:
            if dep.pool is not None:
                dep.pool.abort() if not dep.pool.validated else dep.pool.stop()

    def _check_quotas(self, specs: builtins.list[FunctionSpec]) -> None:
        self.quotas.check(specs, {key: dep.spec for key, dep in self._deployments.items()})

    def _commit(self, staged: builtins.list[Deployment], replace: bool) -> builtins.list[Deployment]:
        try:
            if not replace:
                self._check_absent([dep.spec for dep in staged])  # another deploy got there meanwhile
            self._check_quotas([dep.spec for dep in staged])
        except FunctionServiceError:
            self._abort(staged)
            raise
        for dep in staged:
            self._revision += 1
            dep.revision = self._revision
            old = self._deployments.get(dep.key)
            self._deployments[dep.key] = dep
            self._tenants_of.setdefault(dep.name, set()).add(dep.spec.tenant)
            if old is not None:
                dep.sessions.adopt(old.sessions)  # sessions go on with the new code, told they restarted
                self._retire(old)
            log.info("deployed %s (%s, %s handler, %s executor, revision %d)",
                     dep.name, dep.spec.urn, dep.kind, dep.executor, dep.revision)
            if dep.in_process and "memory" in dep.spec.model_fields_set:
                log.warning("function %s: 'memory: %d' is not enforced for the %s executor (only "
                            "'executor: process' limits memory); the handler shares the server's memory",
                            dep.name, dep.spec.memory, dep.executor)
            for cb in self.on_change:
                cb(dep.key, dep)
        return staged

    # -- stop ----------------------------------------------------------------------------------
    def _retire(self, dep: Deployment) -> None:
        """Stop a deployment that was replaced or deleted: its preStop runs after its invocations."""
        if dep.pool is not None:
            dep.pool.stop(self.stop_grace, self.pre_stop_grace)  # busy workers finish their invocation, then preStop
            return
        thaw()  # its code, loaded here, may have been frozen at start-up (runtime/heap.py): collectable again
        if dep.code is None or dep.code.pre_stop is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a synchronous caller with no loop: nothing can be in flight
            asyncio.run(dep.stop(0))
            return
        task = loop.create_task(dep.stop(self.stop_grace, self.pre_stop_grace),
                                name=f"prestop-{dep.name}-{dep.revision}")
        self._stopping[dep] = task
        task.add_done_callback(lambda _t: self._stopping.pop(dep, None))

    def get(self, ref: str, tenant: str | None = None) -> Deployment:
        """The deployment `ref` (a name, `name:version` or URN) names for `tenant`; FunctionNotFoundError.

        `tenant` None (auth off: no boundary) takes the URN's tenant, else the default tenant's,
        else the only tenant deploying that name. Another tenant's function is not found, with the
        same message as a name nobody deployed.
        """
        dep = self._deployments.get(ref)
        if dep is not None and (tenant is None or dep.spec.tenant == tenant):
            return dep  # a plain name (names hold no ':'), the usual case: nothing to parse or check
        parts = parse_function_ref(ref)
        name, asked = parts["name"] or "", parts["tenant"]
        if (tenant is not None and asked is not None and asked != tenant) or "/" in name:
            raise FunctionNotFoundError(f"function {ref!r} is not deployed")  # a key (`t/name`) is no name
        dep = self._deployments.get(function_key(tenant or asked or DEFAULT_TENANT, name))
        if dep is None and tenant is None and asked is None:
            tenants = self._tenants_of.get(name, ())
            if len(tenants) == 1:
                dep = self._deployments.get(function_key(next(iter(tenants)), name))
        if dep is None:
            raise FunctionNotFoundError(f"function {ref!r} is not deployed")
        check_ref(ref, parts, dep.spec)
        return dep

    def by_key(self, key: str) -> Deployment:
        """The deployment of `key` (`function_key`), as a cluster queue entry names it; 404."""
        dep = self._deployments.get(key)
        if dep is None:
            raise FunctionNotFoundError(f"function {key.rpartition('/')[2]!r} is not deployed")
        return dep

    def delete(self, key: str) -> Deployment:
        """Delete the deployment of `key` (`function_key`; a bare name: the default tenant's)."""
        dep = self._deployments.pop(key, None)
        if dep is None:
            raise FunctionNotFoundError(f"function {key.rpartition('/')[2]!r} is not deployed")
        tenants = self._tenants_of.get(dep.name)
        if tenants is not None:
            tenants.discard(dep.spec.tenant)
            if not tenants:
                del self._tenants_of[dep.name]
        self._retire(dep)
        log.info("deleted %s", key)
        for cb in self.on_change:
            cb(key, None)
        return dep

    async def stop_workers(self) -> None:
        """Shutdown (after `Executor.drain`): run every deployment's preStop and stop every pool,
        within `pre_stop_grace` (the drain gave the invocations their grace already).

        In-process preStops of replaced/deleted deployments stop waiting for their invocations:
        the drain already gave those their grace.
        """
        current = list(self._deployments.values())
        for dep in self._stopping:
            dep.stop_waiting()
        pending = list(self._stopping.values())
        grace = self.pre_stop_grace
        await asyncio.gather(
            *pending,
            *(dep.pool.aclose(0, grace) for dep in current if dep.pool is not None),
            *(dep.stop(0, grace) for dep in current if dep.pool is None),
            return_exceptions=True)
