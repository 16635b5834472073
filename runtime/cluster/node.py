"""One fnstream node in cluster mode: what the frontend and the `worker` command start and ask.

It owns the Redis client, the registry sync, the work queue (frontend side) and, unless the role
is `frontend`, a worker taking queued invocations. The frontend asks it two things per request:
where a function can be found (`lookup`) and whether to run it here or queue it (`should_enqueue`).
"""
from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

from runtime.config import Config
from runtime.errors import FunctionNotFoundError
from runtime.executor import Executor
from runtime.lifecycle import wait_for_stop_signal
from runtime.registry import Deployment, Registry, parse_function_ref
from runtime.streams import BrokerSettings, bind_broker, unbind_broker

from .queue import RemoteInvocation, WorkQueue
from .redis_broker import RedisBroker
from .registry_sync import RegistrySync
from .settings import REDIS_DOWN, ClusterUnavailableError, Keys, connect, describe_url, node_id
from .worker import Worker

__all__ = ("ClusterNode", "serve_worker")

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
        self.queue = WorkQueue(self.redis, self.keys, ttl=cc.outputTtlSeconds, heartbeat=cc.workerHeartbeatSeconds)
        self.worker: Worker | None = None
        self.workers: dict[str, dict[str, Any]] = {}        # live workers (refreshed every heartbeat)
        self.redis_reachable = False
        self._watcher: asyncio.Task[Any] | None = None
        if self.role != "frontend":
            self.worker = Worker(self.redis, self.keys, registry, executor, self.id, concurrency=cc.workerConcurrency,
                                 heartbeat=cc.workerHeartbeatSeconds, claim_idle=cc.claimIdleSeconds,
                                 ttl=cc.outputTtlSeconds)

    async def start(self) -> None:
        self.sync.start()
        self._watcher = asyncio.create_task(self._watch_workers(), name="cluster-watch-workers")
        if self.worker is not None:
            self.worker.start()
        log.info("cluster node %s (role %s) on %s", self.id, self.role, describe_url(self.url))

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await self.sync.stop()
        await asyncio.sleep(0)
        await self.redis.aclose()

    # -- asked by the frontend ---------------------------------------------------------------
    def lookup(self, ref: str) -> Any:
        """A function known to the cluster but not loadable here: something the queue can carry."""
        parts = parse_function_ref(ref)
        name = parts["name"] or ""
        if name in self.sync.unavailable:
            spec, reason = self.sync.unavailable[name]
            for key in ("tenant", "namespace", "version"):
                want = parts[key]
                if want is not None and want != getattr(spec, key) and not (key == "version" and want == "latest"):
                    raise FunctionNotFoundError(f"function {ref!r} is not deployed ({key} is "
                                                f"{getattr(spec, key)!r}, not {want!r})")
            return SimpleNamespace(spec=spec, name=spec.name, kind="remote", unavailable=reason)
        raise FunctionNotFoundError(f"function {ref!r} is not deployed")

    def should_enqueue(self, dep: Any) -> bool:
        """Queue it when this node does not run handlers, cannot load the code, or is full."""
        if not isinstance(dep, Deployment):
            return True
        return self.role == "frontend" or dep.inflight >= dep.spec.concurrency

    async def submit(self, dep: Any, event: Any, **kwargs: Any) -> RemoteInvocation:
        """Queue it for the workers; 503 when Redis is down or no live worker serves the function."""
        if not self.serving(dep.spec.name):
            why = f" (here: {dep.unavailable})" if getattr(dep, "unavailable", None) else ""
            state = "" if self.redis_reachable else f"; Redis at {describe_url(self.url)} is unreachable"
            raise ClusterUnavailableError(f"no live worker serves function {dep.spec.name!r}{why}{state}; "
                                          "retry later")
        return await self.queue.submit(dep.spec, event, **kwargs)

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
                found = {}
                async for key in self.redis.scan_iter(match=self.keys.workers_pattern(), count=100):
                    text = await self.redis.get(key)
                    if text:
                        found[key.rsplit(":", 1)[1]] = json.loads(text)
                self.workers = found
                self.redis_reachable = True
            except REDIS_DOWN:
                self.redis_reachable = False
            await asyncio.sleep(interval)

    def serving(self, name: str) -> bool:
        return any(name in w.get("functions", ()) for w in self.workers.values())

    def status(self) -> dict[str, Any]:
        return {"node": self.id, "role": self.role, "redis": describe_url(self.url),
                "redisReachable": self.redis_reachable, "registrySynced": self.sync.connected,
                "workers": [{"id": k, **v} for k, v in sorted(self.workers.items())],
                "functions": sorted(self.sync.specs),
                "unavailable": {n: reason for n, (_s, reason) in sorted(self.sync.unavailable.items())}}


async def serve_worker(config: Config) -> None:
    """`fnstream worker`: run a worker-only node until SIGINT/SIGTERM."""
    registry = Registry(config.runtime.codeRoots)
    executor = Executor(config.runtime.threadPoolSize)
    node = ClusterNode(config, registry, executor, role="worker")
    await node.start()
    bind_broker(node.broker, asyncio.get_running_loop())   # handlers' named streams live in Redis
    print(f"fnstream worker {node.id} on {describe_url(node.url)}", flush=True)
    try:
        await wait_for_stop_signal()
    finally:
        await node.stop()
        unbind_broker(node.broker)
        await node.broker.close()
        executor.shutdown()
