"""Containing runaway handlers: a per-function bound on threads, and a loop-lag monitor.

A plain `def` handler runs in the shared thread pool, and a thread is stopped only at its next
Python bytecode (runtime/thread_stop.py: never inside one C call). So each function may hold at
most `runtime.threadsPerFunction` threads at once, counting threads whose invocation already
timed out but which are still running (overran): one function spinning in `while True` exhausts
its own share, never the pool. A call waiting for a thread waits on the loop (cancellable: its
deadline passing ends it with a 504 before it ever starts).

Tenants share the pool fairly (TenantShares): one tenant holds at most `runtime.threadsPerTenant`
threads at once (running or overran, summed over its functions), so a tenant flooding slow `def`
handlers leaves the rest of the pool to the others; and when calls of several tenants wait for a
thread, each thread that frees goes to the next tenant in turn (round robin), not to the oldest
call. No handler call ever queues in the pool itself behind another tenant's.

Threads busy on a CPU share one GIL: more than a couple of them at once add no throughput, only
latency to the loop and to every other function. So while `cpuBound` of a function's threads are
found burning CPU (sampled by the executor), its next calls wait for one of them to end instead.

The loop-lag monitor is a periodic timer that measures its own lateness: when the loop was held
(an `async def` handler calling `time.sleep`...) it logs the stall and the functions that were
running on the loop. Its figures (`stalls`, `last_lag`, `max_lag`, `total_stall_seconds`) are
attributes for the metrics exporter.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

__all__ = ("ThreadGate", "LoopLagMonitor", "TenantShares", "Waiters")

log = logging.getLogger("fnstream.runtime")


class Waiters:
    """The callers waiting, in order, for room in a count-limited resource (a function's threads,
    a session's turns). The resource says when it is full and wakes one waiter when room frees;
    the woken caller checks again. A waiter cancelled after its wake-up passes the wake-up on, so
    room is never lost."""

    def __init__(self) -> None:
        self._queue: list[asyncio.Future[None]] = []

    def __bool__(self) -> bool:
        return bool(self._queue)

    async def wait_while(self, full: Callable[[], bool]) -> None:
        while full():
            waiter = asyncio.get_running_loop().create_future()
            self._queue.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.wake_one()  # woken, then cancelled before it could take the room
                raise
            finally:
                if waiter in self._queue:
                    self._queue.remove(waiter)

    def wake_one(self) -> None:
        for waiter in self._queue:
            if not waiter.done():
                waiter.set_result(None)
                return


class TenantShares:
    """The `def` pool's `threads`, at most `per_tenant` of them held by one tenant at once; a thread
    that frees is handed to the next waiting tenant in turn (see the module docstring). O(1) per
    call while nobody waits; the turn is taken only when calls wait."""

    def __init__(self, threads: int, per_tenant: int) -> None:
        self.threads = threads
        self.per_tenant = min(per_tenant, threads)
        self.busy = 0
        self.held: dict[str, int] = {}  # tenant -> threads it holds now (0: it held some before)
        # Tenants with calls waiting, in turn order (a dict keeps insertion order): each call's future.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def try_acquire(self, tenant: str) -> bool:
        """Take a thread for `tenant` if it may have one now (none of its calls waits before it)."""
        held = self.held.get(tenant, 0)
        if self.busy >= self.threads or held >= self.per_tenant or (self._waiting and tenant in self._waiting):
            return False
        self.held[tenant] = held + 1
        self.busy += 1
        return True

    async def acquire(self, tenant: str) -> None:
        """Wait for the thread `_hand_out` gives this call (cancellable)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(tenant)
        if queue is None:
            queue = self._waiting[tenant] = deque()
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(tenant)  # handed a thread, then cancelled before it could use it
            elif self._waiting.get(tenant) is queue:
                try:
                    queue.remove(waiter)
                except ValueError:
                    pass
                if not queue:
                    del self._waiting[tenant]
            raise

    def release(self, tenant: str) -> None:
        self.busy -= 1
        self.held[tenant] -= 1  # a tenant's count stays at 0 (one entry a tenant: bounded)
        if self._waiting:
            self._hand_out()

    def _hand_out(self) -> None:
        """Free threads to waiting calls: the first waiting tenant (in turn) below its share gets one,
        and goes last in the turn."""
        while self.busy < self.threads:
            tenant = next((t for t in self._waiting if self.held.get(t, 0) < self.per_tenant), None)
            if tenant is None:
                return  # nobody waits, or every waiting tenant holds its share
            queue = self._waiting.pop(tenant)
            while queue and queue[0].done():  # cancelled, its task not resumed yet
                queue.popleft()
            if not queue:
                continue
            waiter = queue.popleft()
            if queue:
                self._waiting[tenant] = queue  # last in the turn
            self.held[tenant] = self.held.get(tenant, 0) + 1
            self.busy += 1
            waiter.set_result(None)

    def waiting(self, tenant: str) -> int:
        return len(self._waiting.get(tenant, ()))


class ThreadGate:
    """At most `limit` threads of one function, running or overran their deadline; at most
    `cpu_bound` of them once that many are found burning CPU; and the function's tenant's share
    of the pool (TenantShares), taken with each thread."""

    BURNING = 0.5  # a function whose threads took this share of the process's CPU time burns it
    BUSY = 0.1     # ... and at least this share of the wall time

    def __init__(self, name: str, limit: int, cpu_bound: int | None = None, shares: TenantShares | None = None,
                 tenant: str = "default") -> None:
        self.name = name
        self.shares = shares
        self.tenant = tenant
        self.limit = limit
        self.cpu_bound = cpu_bound or limit
        self.running: dict[int, float] = {}  # thread ident -> its CPU seconds (written by the thread)
        self.burning: set[int] = set()       # of those, threads found burning CPU at the last sample
        self.busy = 0            # threads held (running or overran)
        self.overran = 0         # threads still running past their invocation's deadline
        self.overran_total = 0   # ever (shown in the function's status)
        self._waiters = Waiters()

    def _full(self) -> bool:
        return self.busy >= self.limit or len(self.burning) >= self.cpu_bound

    def try_acquire(self) -> bool:
        """Take a thread if one is free now (no coroutine for the usual case)."""
        if self._waiters or self._full() or (self.shares is not None and not self.shares.try_acquire(self.tenant)):
            return False
        self.busy += 1
        return True

    async def acquire(self) -> None:
        """Wait for a thread of this function, then for its tenant's share (cancellable: the deadline
        watchdog cancels it)."""
        await self._waiters.wait_while(self._full)
        self.busy += 1
        if self.shares is not None and not self.shares.try_acquire(self.tenant):
            try:
                await self.shares.acquire(self.tenant)
            except BaseException:
                self.busy -= 1
                self._waiters.wake_one()
                raise

    def release(self, overran: bool) -> None:
        """A thread ended (on the loop; it already left `running`)."""
        self.busy -= 1
        if overran:
            self.overran -= 1
        if self.shares is not None:
            self.shares.release(self.tenant)
        self._waiters.wake_one()

    def enter(self) -> int:
        """In the handler's thread as it starts: count it among the running (for the CPU sample)."""
        ident = threading.get_ident()
        self.running[ident] = time.thread_time()
        return ident

    def leave(self, ident: int) -> None:
        """In the handler's thread as it ends."""
        self.running.pop(ident, None)

    def sample(self, wall: float, process_cpu: float) -> int:
        """Which running threads burned CPU in the last `wall` seconds, in which the whole process was
        on a CPU for `process_cpu` seconds (runtime/cpu_sampler.py's thread); how many fewer burn.

        The function is CPU-bound when its threads took half the process's CPU time or more (and a
        tenth of the wall time: not a lone short computation on an idle server); then each thread
        that took at least half their average is burning. Relative measures, because threads that
        contend for one GIL each get a sliver of a CPU, and a busy host gives the process less."""
        used: dict[int, float] = {}
        for ident, before in list(self.running.items()):
            try:
                now = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, AttributeError):  # it just ended; or no per-thread clocks here
                continue
            if ident in self.running:
                self.running[ident] = now
                used[ident] = now - before
        total = sum(used.values())
        burning: set[int] = set()
        if used and total >= process_cpu * self.BURNING and total >= wall * self.BUSY:
            burning = {t for t, cpu in used.items() if cpu >= total / len(used) * 0.5}
        freed = len(self.burning) - len(burning)
        if burning and not self.burning:
            log.warning("function %s: %d thread(s) are busy on a CPU; at most %d of its calls run at once "
                        "while they are (runtime.cpuBoundThreadsPerFunction): Python threads share one GIL",
                        self.name, len(burning), self.cpu_bound)
        self.burning = burning  # one assignment: the loop reads the old set or the new one
        return freed

    def wake(self, count: int) -> None:
        """On the loop: `count` fewer threads burn, so as many waiting calls may start."""
        for _ in range(count):
            self._waiters.wake_one()

    def mark_overran(self, invocation_id: str, why: str, *, stopping: bool) -> None:
        """A call ended (`why`: timed out, aborted by the shutdown, its client left) while its
        thread runs on; `stopping`: the thread is being stopped (a timeout), else it is left to end."""
        self.overran += 1
        self.overran_total += 1
        fate = "stopping its thread" if stopping else "its thread runs on until it returns (its writes now raise)"
        log.warning("function %s: invocation %s %s; %s (%d of %d threads of this function held by overrunning "
                    "calls; a thread blocked in a C call stops only when it returns: use 'executor: process' "
                    "for code that must be stoppable)", self.name, invocation_id, why, fate, self.overran,
                    self.limit)

    def describe(self) -> dict[str, int]:
        return {"limit": self.limit, "busy": self.busy, "overran": self.overran,
                "overranTotal": self.overran_total, "burningCpu": len(self.burning)}


def _runqueue_wait() -> tuple[float, float]:
    """(seconds this thread ran on a CPU, seconds it spent ready to run but waiting for one), from
    Linux schedstat; the thread's CPU clock and 0 elsewhere."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return time.thread_time(), 0.0


class LoopLagMonitor:
    """Every `interval` s, how late the timer fired; a lateness over `threshold` s is a stall."""

    def __init__(self, running_on_loop: Callable[[], Iterable[str]], *, interval: float = 0.25,
                 threshold: float = 0.5) -> None:
        self._running_on_loop = running_on_loop
        self.interval = interval
        self.threshold = threshold
        self.stalls = 0
        self.last_lag = 0.0
        self.max_lag = 0.0
        self.total_stall_seconds = 0.0
        self.host_stalls = 0  # stalls the host caused (no CPU for the process), not counted in `stalls`
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        ran, waited = _runqueue_wait()
        while True:
            expected = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            lag = time.monotonic() - expected
            (ran_before, waited_before), (ran, waited) = (ran, waited), _runqueue_wait()
            # Functions that ran on the loop during this interval (the executor remembers them).
            self.record(lag, sorted(set(self._running_on_loop())), waited - waited_before, ran - ran_before)

    def record(self, lag: float, running: list[str], waited: float = 0.0, ran: float = 0.0) -> None:
        """`waited`: how long the loop's thread was ready to run but got no CPU meanwhile; `ran`:
        how long it ran on a CPU. A stall that would not have been one without the waiting is the
        host's (another process was busy), not a handler's: logged as such, counted in
        `host_stalls`, and blames no function. Any other is the loop's own (a busy host only made
        it longer): a stall, logged with the seconds its thread ran and waited."""
        self.last_lag = max(0.0, lag)
        self.max_lag = max(self.max_lag, self.last_lag)
        if self.last_lag < self.threshold:
            return
        if self.last_lag - waited < self.threshold:
            self.host_stalls += 1
            log.warning("event loop stalled for %.2fs, %.2fs of it waiting for a CPU: the host was busy "
                        "(another process had the CPU), not a handler", self.last_lag, waited)
            return
        parts = [*((f"{ran:.2f}s of it on a CPU in the loop's thread",) if ran else ()),
                 *((f"{waited:.2f}s waiting for a CPU",) if waited else ())]
        busy = f" ({', '.join(parts)})" if parts else ""
        self.stalls += 1
        self.total_stall_seconds += self.last_lag
        if running:
            log.warning("event loop stalled for %.2fs%s (every request waited); running on the loop: %s. "
                        "A blocking call in an `async def` handler holds the whole server: make it a "
                        "plain `def` handler or use `await asyncio.to_thread(...)`",
                        self.last_lag, busy, ", ".join(running))
        else:
            log.warning("event loop stalled for %.2fs%s (every request waited) while no handler ran on the "
                        "loop: fnstream itself held it (please report it)", self.last_lag, busy)

    def describe(self) -> dict[str, float | int]:
        return {"stalls": self.stalls, "hostStalls": self.host_stalls, "lastLagSeconds": round(self.last_lag, 4),
                "maxLagSeconds": round(self.max_lag, 4), "totalStallSeconds": round(self.total_stall_seconds, 4)}
