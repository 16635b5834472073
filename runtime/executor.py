"""Runs invocations: `async def` handlers on the loop, plain `def` handlers in a bounded thread pool.

Generators of either kind are iterated and each item becomes one stream write. The function's
timeout is enforced here (openYuanrong's Python executor never does): async handlers are
cancelled; a `def` handler's output is closed (its later writes raise) and its thread is stopped
(runtime/thread_stop.py), retried while it keeps running. Every other kind (process, java) goes to
its kind's Runner, and a call another node runs (remote) to its kind's Forwarder (runtime/executors.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from types import GeneratorType
from typing import Any

from .codec import encode_result
from .context import Context
from .cpu_sampler import CpuSampler
from .deployment import Deployment, FunctionRef
from .errors import FunctionServiceError, FunctionTimeoutError, ServiceUnavailableError, handler_failure
from .executors import ExecutorKind, Forwarder, Runner
from .invocation import Invocation, drain_generator
from .limits import LoopLagMonitor, TenantShares, ThreadGate
from .logs import set_log_context
from .plain import PlainCall
from .streams.tenancy import current_tenant
from .thread_stop import run_stoppable, stop_thread, thread_running
from .threadpool import DaemonThreadPool, settle

__all__ = ("Executor",)

log = logging.getLogger("fnstream.runtime")

DEADLINE_TICK = 0.05  # seconds between deadline checks
STOP_RETRY_SECONDS = 1.0  # a thread that swallowed InvocationStopped (bare except) is stopped again


class Executor:
    """Starts invocations and owns the thread pool for sync handlers."""

    def __init__(self, thread_pool_size: int = 64, threads_per_function: int | None = None,
                 cpu_bound_threads: int = 2, burning_switch_interval: float = 0.0002, *,
                 threads_per_tenant: int | None = None) -> None:
        self._pool = DaemonThreadPool(thread_pool_size, thread_name_prefix="fnstream-handler")
        # What runs the kinds it does not run itself (runtime/executors.py), one per factory, made on first use.
        self._runners: dict[Callable[[], Runner], Runner] = {}
        # What runs calls on other nodes (runtime/executors.py Forwarder): the remote kind's, in cluster mode.
        self._forwarders: list[Forwarder] = []
        self.active: set[Invocation | PlainCall] = set()
        self._watchdog: asyncio.Task[Any] | None = None
        # One function's threads (running or overran) may not take more than this of the pool.
        self.threads_per_function = threads_per_function or max(1, thread_pool_size // 4)
        self.cpu_bound_threads = cpu_bound_threads
        # One tenant's threads (all its functions') may not take more than this of the pool.
        self.shares = TenantShares(thread_pool_size, threads_per_tenant or max(1, thread_pool_size // 2))
        self.cpu_sampler = CpuSampler(burning_switch_interval)
        self._gates: list[ThreadGate] = []
        self._loop_started: set[str] = set()
        self.loop_monitor = LoopLagMonitor(self._running_on_loop)
        # What an inline call runs: one coroutine, in the task that awaits it (made once, not per call).
        self._run_inline: Callable[[Invocation], Awaitable[Any]] = functools.partial(self._run, inline=True)

    def _running_on_loop(self) -> list[str]:
        """Loop-run functions active now or started since the last call (for the loop-lag monitor)."""
        seen, self._loop_started = self._loop_started, set()
        return [*seen, *(inv.spec.name for inv in self.active
                         if inv.deployment.runs.on_loop)]

    def _gate(self, dep: Deployment) -> ThreadGate:
        if dep.thread_gate is None:
            dep.thread_gate = ThreadGate(dep.name, self.threads_per_function, self.cpu_bound_threads, self.shares,
                                         dep.spec.tenant)
            self._gates.append(dep.thread_gate)
            self.cpu_sampler.watch(dep.thread_gate, asyncio.get_running_loop())
        return dep.thread_gate

    def runner(self, kind: ExecutorKind) -> Runner:
        """The runner of a kind the Executor does not run itself (process, java)."""
        assert kind.runner is not None, kind.name
        runner = self._runners.get(kind.runner)
        if runner is None:
            runner = self._runners[kind.runner] = kind.runner()
        return runner

    def forward(self, kind: ExecutorKind, membership: Any) -> None:
        """Run calls of `kind` (a forwarding kind: remote) with its forwarder, made from the node's
        `membership` (its ClusterNode): done once, by the composition root (runtime/node.py)."""
        assert kind.forwarder is not None, kind.name
        self._forwarders.append(kind.forwarder(membership))

    def forwarder_of(self, function: FunctionRef) -> Forwarder | None:
        """What takes this call of `function` to another node now (remote: this node cannot load
        it, runs no handlers, or the function is at its concurrency here), or None: it runs here."""
        for forwarder in self._forwarders:
            if forwarder.takes(function):
                return forwarder
        return None

    async def aclose_runners(self) -> None:
        """Shutdown: each runner ends what it still owns (a process runner reaps cancelled handlers)."""
        for runner in self._runners.values():
            await runner.aclose()

    def abandoned_threads(self) -> int:
        """Handler threads still running (at shutdown: those the process will abandon)."""
        return sum(g.busy for g in self._gates)

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        # In a copy of the caller's context: log records of thread handlers keep the invocation's
        # tags, and its tenant scopes the handler's named streams.
        return self._pool.run_soon(asyncio.get_running_loop(), contextvars.copy_context().run, fn, *args)

    def start(self, inv: Invocation, *, inline: bool = False) -> asyncio.Task[Any] | None:
        """Take a concurrency slot (429 when full) and run the invocation in its own task.

        With `inline`, a plain-JSON call of an in-process handler does not get a task: it runs in
        the caller's own task when the caller awaits `inv.outcome()` (one task and one loop turn
        less per request; nothing reads its output concurrently anyway). A `def` handler still
        runs in the thread pool; the caller's task awaits its thread. A runner that defers
        (DeferringRunner: the process executor) runs such a call in the caller's task too.
        """
        dep = inv.deployment
        if inline and inv.session is None and inv.mode == "json" and dep.in_process:
            dep.acquire()
            inv.defer(self._run_inline)
            return None
        if not dep.in_process:
            runner = self.runner(dep.runs)
            defer = getattr(runner, "defer", None) if inline and inv.session is None and inv.mode == "json" else None
            if defer is not None:  # a DeferringRunner (an isinstance of a Protocol costs more than a call)
                defer(inv, self.active.discard)
                self.active.add(inv)
                return None
            task = runner.start(inv)
            task.add_done_callback(lambda _t: self.active.discard(inv))
        else:
            dep.acquire()
            run = self._run(inv) if inv.session is None else self._run_in_session(inv)
            task = inv.task = inv.loop.create_task(run, name=f"invocation-{inv.id}")
            task.add_done_callback(functools.partial(self._ended, inv))  # (a partial: smaller than a closure)
        self.active.add(inv)
        self._watch_deadlines()
        return task

    def _ended(self, inv: Invocation, _task: object = None) -> None:
        self.active.discard(inv)
        if not inv.entered:
            # Cancelled before its first step, so `_run`'s own cleanup never ran.
            inv.close_output()
            inv.deployment.release()

    async def call_plain(self, call: PlainCall) -> str:
        """Run a plain JSON call (runtime/plain.py) in the caller's task: its result as JSON text.

        The bookkeeping of `start` + `_run` for one `async def` or `def` handler already initialized,
        without a task, channel or deferred run of its own: the slot (429 when full), the deadline
        (the watchdog cancels this task), the log context and tenant, the handler's failures."""
        dep = call.deployment
        dep.acquire()
        call.task = asyncio.current_task()
        active = self.active
        active.add(call)
        watchdog = self._watchdog
        if watchdog is None or watchdog.done():
            self._watch_deadlines()
        spec = call.spec
        set_log_context(call.trace_id, spec.name, call.id)
        tenant_token = current_tenant.set(spec.tenant)  # named streams are the function's tenant's
        in_pool = False
        try:
            ctx = Context(spec, call)
            if dep.kind == "async":
                self._loop_started.add(spec.name)
                result = await dep.code.handler(call.event, ctx)  # type: ignore[union-attr]  # loaded
            else:
                in_pool = True
                result = await self._run_in_pool(call, ctx)
            return encode_result(result, call.max_response_size)
        except asyncio.CancelledError as exc:
            error = self._cancelled(call, exc, inline=True)
            if error is exc:
                raise
            raise error from None
        except FunctionServiceError:
            dep.failures += 1
            raise
        except BaseException as exc:
            raise self._failed(call, exc) from None
        finally:
            current_tenant.reset(tenant_token)
            if not in_pool:
                dep.release()
            active.discard(call)

    def _cancelled(self, inv: Invocation | PlainCall, exc: asyncio.CancelledError, inline: bool) -> BaseException:
        """What a handler's run raises for the CancelledError `exc`: a timeout, the abort error, a
        handler failure (its own code let a CancelledError escape), or `exc` itself (a cancel)."""
        task = asyncio.current_task()
        assert task is not None
        if inv.timed_out is not None:  # the deadline watchdog's doing, not the client's
            task.uncancel()
            inv.deployment.failures += 1
            return FunctionTimeoutError(inv.timed_out)
        if inline and inv.abort_error is not None:  # fnstream stopped it (shutdown): answer that
            task.uncancel()
            return inv.abort_error
        if inv.cancel_reason is None and task.cancelling() == 0:
            # Nobody cancelled this task: the handler's own code let a CancelledError escape
            # (e.g. it awaited a future someone else cancelled). A handler failure, not a cancel.
            return self._failed(inv, exc)
        return exc

    @staticmethod
    def _failed(inv: Invocation | PlainCall, exc: BaseException) -> FunctionServiceError:
        """A handler's own exception (SystemExit, KeyboardInterrupt, a BaseException of its own
        included): logged with its traceback, answered as the function's failure."""
        inv.deployment.failures += 1
        log.error("function %s invocation %s raised:\n%s", inv.deployment.name, inv.id,
                  "".join(traceback.format_exception(exc)))
        return handler_failure(exc)

    def _watch_deadlines(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._deadline_watchdog(), name="deadlines")

    async def _deadline_watchdog(self) -> None:
        """Time out invocations past their deadline, checking every DEADLINE_TICK seconds.

        One periodic check instead of a timer per invocation: a timer costs more per request
        than the rest of the runtime layer, and timeouts are seconds while the tick is 50 ms.
        Process functions enforce their own deadline (their worker is killed).
        """
        while self.active:
            await asyncio.sleep(DEADLINE_TICK)
            now = time.monotonic()
            for inv in [i for i in self.active if i.deadline <= now]:
                if not inv.deployment.runs.own_deadline:
                    inv.time_out(f"function {inv.spec.name!r} timed out after {inv.spec.timeout:g} s")

    async def _run_in_session(self, inv: Invocation) -> Any:
        """One turn of an X-Instance-Session: wait until the session has room, then run.

        In process there is one instance, so nothing is pinned; the turn limit and interrupt apply.
        """
        session = inv.session
        assert session is not None
        try:
            await session.enter(inv)
        except asyncio.CancelledError:
            if inv.timed_out is not None:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                raise FunctionTimeoutError(inv.timed_out) from None
            raise
        try:
            return await self._run(inv)
        finally:
            session.leave(inv)

    async def drain(self, grace: float) -> int:
        """Let in-flight invocations finish for `grace` seconds, then abort the rest (shutdown)."""
        if self.active:
            log.info("waiting up to %gs for %d in-flight invocation(s)", grace, len(self.active))
            await asyncio.wait([inv.task for inv in self.active if inv.task], timeout=grace)  # 0: abort at once
        left = list(self.active)
        for inv in left:
            inv.abort(ServiceUnavailableError("the server is shutting down"))
        if left:
            log.warning("aborted %d invocation(s) still running after %gs", len(left), grace)
        return len(left)

    def shutdown(self) -> None:
        self.cpu_sampler.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, inv: Invocation, inline: bool = False) -> Any:
        if inline:
            inv.task = asyncio.current_task(inv.loop)  # (its loop named: no lookup of the running one)
            self.active.add(inv)
            self._watch_deadlines()
        inv.entered = True
        dep = inv.deployment
        set_log_context(inv.trace_id, dep.name, inv.id)
        tenant_token = current_tenant.set(dep.spec.tenant)  # named streams are the function's tenant's
        in_pool = False  # once True, _run_in_pool gives the concurrency slot back (maybe later)
        try:
            if not dep.ready:  # one coroutine less per call once initialized
                await dep.ensure_initialized(self.run_sync)
            ctx = Context(dep.spec, inv)
            assert dep.code is not None  # in-process deployments have their code loaded
            handler = dep.code.handler
            if dep.kind == "async":
                self._loop_started.add(dep.spec.name)
                result = await handler(inv.event, ctx)
                if inv.has_stream:  # a last write the handler did not await must not be lost
                    await inv.stream.flush()
                return result
            if dep.kind == "asyncgen":
                self._loop_started.add(dep.spec.name)
                # aclosing: a cancelled generator runs its cleanup now, not at garbage collection
                async with contextlib.aclosing(handler(inv.event, ctx)) as items:
                    async for item in items:
                        await inv.add_item(item)
                return None
            in_pool = True
            return await self._run_in_pool(inv, ctx)
        except asyncio.CancelledError as exc:
            error = self._cancelled(inv, exc, inline)
            if error is exc:
                raise
            raise error from None
        except FunctionServiceError:
            # Raised by fnstream itself (timeout, init failure, a refused write...): already clear.
            dep.failures += 1
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, a BaseException of its own: its failure
            raise self._failed(inv, exc) from None
        finally:
            current_tenant.reset(tenant_token)
            inv.close_output()
            if not in_pool:
                dep.release()
            if inline:
                self.active.discard(inv)

    async def _run_in_pool(self, inv: Invocation | PlainCall, ctx: Context) -> Any:
        """A `def` handler's call on a pool thread, within its function's ThreadGate. Apart from
        _run so that loop-run handlers carry none of this per call; gives the slot back itself."""
        dep = inv.deployment
        gate = dep.thread_gate or self._gate(dep)
        submitted = False
        waiter: asyncio.Future[Any] | None = None
        # Whether the thread ended, whether it outlived its call, and the future an abandoned
        # thread's end resolves (made only then): what `asyncio.shield` of one future gave, without
        # its second future and callbacks per call.
        ended = False
        overran = False
        thread_done: asyncio.Future[Any] | None = None

        def deliver(result: Any, exc: BaseException | None) -> None:
            nonlocal ended
            ended = True
            gate.release(overran)
            assert waiter is not None
            settle(waiter, result, exc)
            if thread_done is not None:
                settle(thread_done, result, exc)

        try:
            if not gate.try_acquire():
                await gate.acquire()  # cancellable: a deadline passing here ends the call before it starts
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            # In a copy of the caller's context, as run_sync: the log tags and tenant of the call.
            self._pool.run_then(loop, deliver, contextvars.copy_context().run, _call_in_thread, inv, ctx)
            submitted = True  # from here the thread will end, and say so
            return await waiter
        finally:
            if not submitted:
                dep.release()
            elif not ended:
                # The thread cannot be killed. After a timeout the answer went out and the slot is
                # free: the thread holds one of the function's threads (ThreadGate) until it really
                # ends, and the status says so. A thread whose client left keeps its slot till it ends.
                thread_done = loop.create_future()
                overran = self._abandon(inv, gate, thread_done)
            else:
                dep.release()

    def _abandon(self, inv: Invocation | PlainCall, gate: ThreadGate, thread_done: asyncio.Future[Any]) -> bool:
        """The call ended while its thread has not: whether the handler runs (it overran; stopped if
        it timed out), the slot given back now (a timeout) or when `thread_done` resolves."""
        dep = inv.deployment
        timed_out = inv.timed_out is not None
        ident = thread_running(inv)
        if ident:
            gate.mark_overran(inv.id, _why_ended(inv), stopping=timed_out)
            if timed_out:
                self._stop(inv, ident, thread_done)

        def _thread_ended(future: asyncio.Future[Any]) -> None:
            if not timed_out:
                dep.release()
            if not future.cancelled() and future.exception() is not None:
                log.info("function %s: abandoned invocation %s ended: %r", dep.name, inv.id, future.exception())

        thread_done.add_done_callback(_thread_ended)
        if timed_out:
            dep.release()
        return bool(ident)

    def _stop(self, inv: Invocation | PlainCall, ident: int, thread_future: asyncio.Future[Any]) -> None:
        """Stop the thread of a timed-out invocation; again every STOP_RETRY_SECONDS while it runs."""
        if thread_future.done():
            return
        if stop_thread(ident, inv):
            log.info("function %s: stopping the thread of timed-out invocation %s", inv.spec.name, inv.id)
        asyncio.get_running_loop().call_later(STOP_RETRY_SECONDS, self._stop, inv, ident, thread_future)


def _why_ended(inv: Invocation | PlainCall) -> str:
    """Why a call ended while its thread still runs, for the log: what really happened."""
    if inv.timed_out is not None:
        return f"timed out after {inv.spec.timeout:g}s"
    if inv.abort_error is not None:
        return f"was aborted: {inv.abort_error.message}"
    return f"was cancelled: {inv.cancel_reason or 'its caller went away'}"


def _call_in_thread(inv: Invocation | PlainCall, ctx: Context) -> Any:
    gate = inv.deployment.thread_gate
    assert gate is not None
    ident = gate.enter()
    try:
        return run_stoppable(inv, _call_handler, inv, ctx)
    finally:
        gate.leave(ident)


def _call_handler(inv: Invocation | PlainCall, ctx: Context) -> Any:
    # Checked once this thread is known to run `inv` (`thread_running`): a call abandoned before
    # then never starts, one abandoned after is stopped (a timeout) or marked overran.
    if inv.cancel_reason is not None or time.monotonic() >= inv.deadline:
        # It waited for a free thread past its deadline (or its client left): never start. A
        # timeout, even if the watchdog has not said so yet (never a 200 for a call never made).
        raise FunctionTimeoutError(f"function {inv.spec.name!r} timed out after {inv.spec.timeout:g} s "
                                   "waiting for a thread")
    code = inv.deployment.code
    assert code is not None
    result = code.handler(inv.event, ctx)
    if type(result) is GeneratorType:  # (not inspect.isgenerator: one call less per call)
        return drain_generator(result, inv.add_item_blocking)
    return result
