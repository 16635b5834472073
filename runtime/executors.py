"""The executor kinds: where a function's invocations run, chosen from one table.

An `ExecutorKind` says what the rest of the runtime needs to know of a kind, so that no module
branches on a kind's name:

- `in_process`: this node imports the handler's code and the `Executor` runs its invocations
  (`async` on the event loop, `thread` in the bounded thread pool: runtime/executor.py);
- `runner`: for every other kind, what starts an invocation — `Runner.start(inv)` takes the
  function's concurrency slot, runs it and returns its task; its writes stream into
  `inv.channel` as the handler makes them; a cancel (`inv.cancel()`: client gone, session
  interrupted, shutdown) cancels that task and the runner applies its own stop rules; `aclose()`
  at shutdown. One runner per executor, shared by the kinds that name the same factory;
- `forwarder`: a kind whose calls run on another node (`remote`: the cluster's worker nodes) —
  not an Invocation made here but the call itself: `Forwarder.takes(function)` says whether a
  call of a function (of whatever kind of its own) goes there now, `submit(...)` sends it and
  returns what relays it. Its factory is given the node's membership by the composition root
  (runtime/node.py: `Executor.forward`); the dispatcher asks the Executor which forwarder, if any,
  takes a call (`Executor.forwarder_of`), and otherwise runs it here;
- `pool`: pooled kinds — capacity and scaling. The per-function pool of worker processes
  (`runtime/process/pool.py` WorkerPool: slots per instance, min/max instances, scale up/down,
  `status()` for the admin view and metrics), started by the registry at deploy, counted against
  `runtime.maxWorkerProcesses`;
- `own_deadline`: the kind enforces the function's timeout itself (a worker process is killed),
  so the Executor's deadline watchdog leaves it alone; `on_loop`: its handlers run on this
  node's event loop (the loop-lag monitor names them); `selectable`: a manifest's `executor:`
  may name it (`java` follows from `runtime: java`, `remote` from a cluster the node cannot
  load the code of).

`KINDS` maps each name to the module attribute that defines it, imported on first use (so this
module is a leaf: the manifest checks `executor:` against it). Adding a kind is one module that
defines its `ExecutorKind` (and, unless in-process, a Runner) and one line here.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

__all__ = ("ExecutorKind", "Runner", "DeferringRunner", "Forwarder", "KINDS", "SELECTABLE", "kind_named", "kind_of")


# This module is a leaf (the manifest and Deployment import it), so it names the types it passes
# on in words: `inv` is a runtime/invocation.py Invocation, a pool a runtime/process/pool.py WorkerPool.


class Runner(Protocol):
    """Runs the invocations of the kinds the Executor does not run itself."""

    def start(self, inv: Any) -> asyncio.Task[Any]: ...

    async def aclose(self) -> None: ...


class DeferringRunner(Runner, Protocol):
    """A runner that can also run a plain JSON call in the task that awaits its outcome:
    `defer(inv, ended)` takes the concurrency slot and hands `inv` the run (`inv.defer`), which
    calls `ended(inv)` once over — one task and one loop turn less per call than `start`."""

    def defer(self, inv: Any, ended: Callable[[Any], None]) -> None: ...


class Forwarder(Protocol):
    """Runs calls on another node. `function` is a runtime/deployment.py FunctionRef, `options` and
    `limits` the dispatcher's InvokeOptions and Limits; `submit` returns an InvocationSurface
    (runtime/surface.py) relaying the call, or raises (e.g. 503: nobody there serves it)."""

    def takes(self, function: Any) -> bool: ...

    async def submit(self, function: Any, event: Any, options: Any, limits: Any) -> Any: ...


class PoolFactory(Protocol):
    """`(spec, code_roots, *, budget)` -> the function's WorkerPool, not started yet."""

    def __call__(self, spec: Any, code_roots: list[Any], *, budget: Any) -> Any: ...


class _Spec(Protocol):  # what kind_of reads of a runtime/manifest.py FunctionSpec
    @property
    def is_java(self) -> bool: ...
    @property
    def executor(self) -> str | None: ...


@dataclass(frozen=True, slots=True, eq=False)
class ExecutorKind:
    name: str
    in_process: bool
    on_loop: bool = False
    own_deadline: bool = False
    selectable: bool = True
    runner: Callable[[], Runner] | None = None
    forwarder: Callable[[Any], Forwarder] | None = None   # given the node's membership (e.g. a ClusterNode)
    pool: PoolFactory | None = None

    @property
    def pooled(self) -> bool:
        return self.pool is not None


ASYNC = ExecutorKind("async", in_process=True, on_loop=True)  # `async def` handlers, tasks on the loop
THREAD = ExecutorKind("thread", in_process=True)               # plain `def` handlers, the bounded thread pool

#: name -> "module:attribute" of its ExecutorKind (imported on first use), or the kind itself
KINDS: dict[str, ExecutorKind | str] = {
    "async": ASYNC,
    "thread": THREAD,
    "process": "runtime.process.kind:PROCESS",   # worker processes (Python)
    "java": "runtime.java.kind:JAVA",            # worker JVMs, the same frame protocol
    "remote": "runtime.cluster.kind:REMOTE",     # queued for the cluster's worker nodes
}
#: what a manifest's `executor:` may name
SELECTABLE = ("async", "thread", "process")


def kind_named(name: str) -> ExecutorKind:
    """The kind of that name (KeyError for an unknown one)."""
    entry = KINDS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        assert isinstance(entry, ExecutorKind) and entry.name == name, entry
        KINDS[name] = entry
    return entry


def kind_of(spec: _Spec) -> ExecutorKind | None:
    """The kind a manifest asks for, known before any code is loaded: `java` for a Java function,
    else its `executor:`; None when it names none (the handler's kind decides: async or thread)."""
    if spec.is_java:
        return kind_named("java")
    return None if spec.executor is None else kind_named(spec.executor)
