"""One fnstream node in cluster mode: what the frontend and the `worker` command start and ask.

It owns the Redis client, the registry sync, the work queue (frontend side) and, unless the role
is `frontend`, a worker taking queued invocations. Two things are asked of it per request: where
a function can be found (`lookup`, by the dispatcher) and whether to run it here or queue it
(`should_enqueue`, by the remote kind's forwarder: runtime/cluster/kind.py, which then `submit`s it).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from runtime.config import Config
from runtime.deployment import (
    DEFAULT_TENANT,
    Deployment,
    FunctionRef,
    RemoteFunction,
    check_ref,
    function_key,
    parse_function_ref,
)
from runtime.errors import FunctionNotFoundError
from runtime.executor import Executor
from runtime.manifest import FunctionSpec
from runtime.principal import Principal, may_manage
from runtime.registry import Registry
from runtime.streams import BrokerSettings
from runtime.surface import Mode

from ..tasks import stop_tasks
from .queue import RemoteInvocation, WorkQueue
from .redis_broker import RedisBroker
from .registry_sync import RegistrySync
from .settings import REDIS_DOWN, ClusterUnavailableError, Keys, connect, describe_url, node_id
from .wire import WireError, decode_heartbeat
from .worker import QueueConsumer

__all__ = ("ClusterNode",)

log = logging.getLogger("fnstream.cluster")


class ClusterNode:
    """Registry sync + work queue + (optionally) a worker, over one Redis."""

    def __init__(self, config: Config, registry: Registry, executor: Executor, *, role: str | None = None) -> None:
        cc = config.cluster
        if not cc.redisUrl:
            raise ValueError("cluster mode needs cluster.redisUrl")
        self.config = config
        self.role = role or cc.role
        self.url = cc.redisUrl
        self.id = node_id(self.role)
        self.keys = Keys(cc.keyPrefix)
        self.redis = connect(cc.redisUrl)
        self.registry = registry
        self.sync = RegistrySync(self.redis, self.keys, registry, self.id, interval=cc.registrySyncSeconds,
                                 publish=self.role != "worker")
        self.broker = RedisBroker(connect(cc.redisUrl, decode=False), cc.keyPrefix,
                                  BrokerSettings.from_config(config.streams))
        self.queue = WorkQueue(self.redis, self.keys, self.id, ttl=cc.outputTtlSeconds,
                               heartbeat=cc.workerHeartbeatSeconds)
        self.consumer: QueueConsumer | None = None
        self.workers: dict[str, dict[str, Any]] = {}   # live workers (refreshed every heartbeat)
        self.redis_reachable = False
        self._reachable_since = 0.0   # time.monotonic() when the watcher last found Redis back
        self._watcher: asyncio.Task[None] | None = None
        self._refused: dict[str, str] = {}   # worker id -> why its heartbeat is not read (logged once)
        if self.role != "frontend":
            self.consumer = QueueConsumer(self.redis, self.keys, registry, executor, self.id,
                                      concurrency=cc.workerConcurrency, heartbeat=cc.workerHeartbeatSeconds,
                                      claim_idle=cc.claimIdleSeconds, ttl=cc.outputTtlSeconds)

    async def start(self) -> None:
        self.sync.start()
        self._watcher = asyncio.create_task(self._watch_workers(), name="cluster-watch-workers")
        if self.consumer is not None:
            self.consumer.start()
        log.info("cluster node %s (role %s) on %s", self.id, self.role, describe_url(self.url))

    async def stop_taking(self) -> None:
        """Shutdown, first step: take no more queued work (heartbeats and cancels go on meanwhile)."""
        if self.consumer is not None:
            await self.consumer.stop_taking()

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        await stop_tasks((self._watcher,), "cluster node")
        await self.queue.close()
        await self.sync.stop()
        await asyncio.sleep(0)
        await self.redis.aclose()

    # -- asked by the frontend ---------------------------------------------------------------
    def lookup(self, ref: str, tenant: str | None = None) -> RemoteFunction:
        """A function of `tenant` known to the cluster but not loadable here: something the queue can
        carry (tenant None, auth off: the URN's, else the default tenant's, else the only one's)."""
        parts = parse_function_ref(ref)
        name, asked = parts["name"] or "", parts["tenant"]
        unavailable = self.sync.unavailable
        if (tenant is None or asked in (None, tenant)) and "/" not in name:  # a key (`t/name`) is no name
            key = function_key(tenant or asked or DEFAULT_TENANT, name)
            if key not in unavailable and tenant is None and asked is None:  # auth off: the only one's
                found = [k for k, (spec, _why) in unavailable.items() if spec.name == name]
                key = found[0] if len(found) == 1 else key
            if key in unavailable:
                spec, reason = unavailable[key]
                check_ref(ref, parts, spec)
                return RemoteFunction(spec, reason)
        raise FunctionNotFoundError(f"function {ref!r} is not deployed")

    def should_enqueue(self, function: FunctionRef) -> bool:
        """Queue it when this node does not run handlers, cannot load the code, or is full."""
        if not isinstance(function, Deployment):
            return True
        return self.role == "frontend" or function.inflight >= function.spec.concurrency

    async def submit(self, function: FunctionRef, event: Any, *, mode: Mode, buffer_events: int,
                     max_write_size: int, max_response_size: int, trace_id: str | None,
                     timeout: float | None = None, buffer_bytes: int | None = None,
                     keep_items: bool = False, accepted: bool = False,
                     invocation_id: str | None = None) -> RemoteInvocation:
        """Queue it for the workers; 503 when Redis is down or no live worker serves the function.
        `accepted` work (a stored job) waits instead, within its deadline, while Redis is down or
        the workers have yet to announce themselves again after it came back."""
        dep = function
        until = time.monotonic() + (dep.spec.timeout if timeout is None else min(timeout, dep.spec.timeout))
        while not self.serving(dep.key):
            if not (accepted and self._recovering() and time.monotonic() < until):
                why = f" (here: {dep.unavailable})" if isinstance(dep, RemoteFunction) else ""
                state = "" if self.redis_reachable else f"; Redis at {describe_url(self.url)} is unreachable"
                raise ClusterUnavailableError(f"no live worker serves function {dep.spec.name!r}{why}{state}; "
                                              "retry later")
            await asyncio.sleep(self.config.cluster.workerHeartbeatSeconds / 2)
        return await self.queue.submit(dep.spec, event, mode=mode, buffer_events=buffer_events,
                                       max_write_size=max_write_size, max_response_size=max_response_size,
                                       trace_id=trace_id, timeout=timeout, buffer_bytes=buffer_bytes,
                                       keep_items=keep_items, reply=self._all_answer(dep.key),
                                       accepted=accepted, invocation_id=invocation_id)

    def _recovering(self) -> bool:
        """Redis is unreachable, or came back so recently that the workers' heartbeat keys (which
        expired meanwhile) may not all be set again: three heartbeats and a scan."""
        if not self.redis_reachable:
            return True
        return time.monotonic() - self._reachable_since < 4 * self.config.cluster.workerHeartbeatSeconds

    async def require(self) -> None:
        """503 unless Redis answers (for admin changes, which must reach every node)."""
        try:
            await self.redis.ping()
        except REDIS_DOWN as exc:
            raise ClusterUnavailableError(f"the cluster store (Redis at {describe_url(self.url)}) is unreachable: "
                                          f"{exc}; deploys need it, retry later") from None

    async def _watch_workers(self) -> None:
        interval = self.config.cluster.workerHeartbeatSeconds
        while True:
            try:
                found, refused = {}, {}
                async for key in self.redis.scan_iter(match=self.keys.workers_pattern(), count=100):
                    text = await self.redis.get(key)
                    worker = key.rsplit(":", 1)[1]
                    if text:
                        try:
                            found[worker] = decode_heartbeat(worker, text)
                        except WireError as exc:   # not a live worker to this node: said once per worker
                            if self._refused.get(worker) != exc.message:
                                log.warning("cluster: not counting worker %s as live: %s", worker, exc.message)
                            refused[worker] = exc.message
                self.workers, self._refused = found, refused
                if not self.redis_reachable:
                    self._reachable_since = time.monotonic()
                self.redis_reachable = True
            except REDIS_DOWN:
                self.redis_reachable = False
            await asyncio.sleep(interval)

    def serving(self, name: str) -> bool:
        return any(name in w.get("functions", ()) for w in self.workers.values())

    def _all_answer(self, name: str) -> bool:
        """Every live worker of `name` puts JSON answers on a frontend's answers stream (a worker of
        the version before announces no `answers` and writes them to the invocation's own stream)."""
        return all(w.get("answers") for w in self.workers.values() if name in w.get("functions", ()))

    def status(self, principal: Principal | None = None) -> dict[str, Any]:
        """This node, Redis and the workers, as `principal` may see them: a token that is not `admin`
        sees only its own tenant's functions, by name (runtime/principal.py may_manage; None: auth
        off); across tenants a function is shown by its key, `tenant/name` (the default tenant's: name)."""
        def spec_of(key: str) -> FunctionSpec | None:
            return self.sync.specs.get(key) or self.sync.unavailable.get(key, (None, ""))[0]

        def shown(key: str) -> bool:
            spec = spec_of(key)
            return may_manage(principal, spec.tenant if spec is not None else "")  # unknown: admin only

        def label(key: str) -> str:
            one_tenant = principal is not None and principal.role != "admin"
            return key.rpartition("/")[2] if one_tenant else key

        workers = [{"id": k, **v, "functions": [label(f) for f in v.get("functions", ()) if shown(f)]}
                   for k, v in sorted(self.workers.items())]
        return {"node": self.id, "role": self.role, "redis": describe_url(self.url),
                "redisReachable": self.redis_reachable, "registrySynced": self.sync.connected,
                "workers": workers, "functions": [label(n) for n in sorted(self.sync.specs) if shown(n)],
                "unavailable": {label(n): reason for n, (_s, reason) in sorted(self.sync.unavailable.items())
                                if shown(n)}}
