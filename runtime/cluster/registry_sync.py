"""The shared function registry: deploys, redeploys and deletes on any node reach every node.

Redis holds one record per function (hash `functions`, field `function_key(tenant, name)`: names
are per tenant; a record written before that, under a bare name, is read by its spec's tenant and
name); every change bumps a version counter
and is announced on a pub/sub channel. Each node applies changes on the announcement and also
re-reads the hash every `registrySyncSeconds`, so a missed message costs at most that long.
Handler code is loaded from the node's own disk: a node that cannot load it keeps the function
as *unavailable* with the reason (its frontend can still enqueue it for workers).
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

from runtime.deployment import DEFAULT_TENANT, Deployment, function_key
from runtime.errors import FunctionServiceError
from runtime.manifest import FunctionSpec
from runtime.registry import Registry

from ..tasks import checkpoint, stop_tasks
from .settings import REDIS_DOWN, AnyRedis, Backoff, ClusterUnavailableError, Keys
from .wire import Record, WireError, decode_record, encode_record

__all__ = ("RegistrySync",)

log = logging.getLogger("fnstream.cluster")

# A function's record stored or deleted. KEYS: the functions hash, the epoch; ARGV: a field to drop
# first ('' for none), the field, its record ('' to delete the field), the epoch to set if none is.
_STORE = """
redis.call('SET', KEYS[2], ARGV[4], 'NX')
if ARGV[1] ~= '' then redis.call('HDEL', KEYS[1], ARGV[1]) end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[2]) else redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) end
return 1
"""

# The registry read in one step: the epoch and every record (KEYS: the functions hash, the epoch).
# Two commands could straddle a Redis restart and pair the old epoch with a half-refilled hash.
_READ = """
return {redis.call('GET', KEYS[2]), redis.call('HGETALL', KEYS[1])}
"""


def _relative_code_path(spec: FunctionSpec, roots: list[Path]) -> str | None:
    for root in roots:
        try:
            return str(Path(spec.codePath).resolve().relative_to(root))
        except ValueError:
            continue
    return None


class RegistrySync:
    """Keeps a local Registry equal to the shared one in Redis."""

    def __init__(self, redis: AnyRedis, keys: Keys, registry: Registry, node: str, *,
                 interval: float = 1.0, publish: bool = True) -> None:
        self.redis, self.keys, self.registry, self.node = redis, keys, registry, node
        self.interval = interval
        self.publish = publish              # worker-only nodes never publish their own deploys
        self.unavailable: dict[str, tuple[FunctionSpec, str]] = {}
        self.specs: dict[str, FunctionSpec] = {}   # every function of the cluster, loaded or not
        self._applied: dict[str, int] = {}         # key -> version of the record applied here
        self._fields: dict[str, str] = {}          # key -> the hash field holding its record, when not the key
        self._pending: dict[str, FunctionSpec | None] = {}
        self._refused: dict[str, str] = {}         # hash field -> why its record is not read (logged once)
        self._applying = False                     # a delete from Redis is being applied here
        self._applying_specs: set[int] = set()     # ids of the specs from Redis being deployed here
        self._wake = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self._listener: asyncio.Task[Any] | None = None
        self.connected = False
        self._pushed = False
        self._epoch: bytes | str | None = None     # the registry's epoch when this node last synced
        self._republishing = False                 # a lost registry seen, this node's functions not all back
        registry.on_change.append(self._on_local_change)

    # -- local changes -----------------------------------------------------------------------
    def _on_local_change(self, name: str, dep: Deployment | None) -> None:
        # Changes that came from Redis are not published again. A deploy from Redis is recognised by
        # its spec object, not by a flag: a local deploy may commit while `adeploy` awaits workers.
        if self._applying or (dep is not None and id(dep.spec) in self._applying_specs):
            return
        self.unavailable.pop(name, None)
        if dep is None:
            self.specs.pop(name, None)
        else:
            self.specs[name] = dep.spec
        if self.publish:
            self._pending[name] = dep.spec if dep is not None else None

    async def flush(self) -> None:
        """Store local changes in Redis and announce them (503 when Redis is unreachable)."""
        while self._pending:
            name, spec = next(iter(self._pending.items()))
            try:
                version = await self._store(name, spec)
            except REDIS_DOWN as exc:
                raise ClusterUnavailableError(f"the change to {name!r} was applied on this node but could not be "
                                              f"stored in the cluster (Redis unreachable: {exc}); it is retried "
                                              "in the background") from None
            if self._pending.get(name, 0) is spec:
                del self._pending[name]
            self._applied[name] = version

    async def _store(self, name: str, spec: FunctionSpec | None) -> int:
        # Resolving the code path reads the file system: off the loop.
        rel = None if spec is None else await asyncio.to_thread(_relative_code_path, spec, self.registry.code_roots)
        version = int(await self.redis.incr(self.keys.version))
        old = self._fields.pop(name, "")  # a record of an older node, under the bare name: moved to its key
        record = "" if spec is None else encode_record(spec.record(), version, self.node, rel)
        # One script, atomic on one key: not a MULTI pipeline, which redis-py runs on a Redis Cluster
        # from a thread of its own that the event loop waits for (each command: a thread, joined).
        await self.redis.eval(_STORE, 2, self.keys.functions, self.keys.epoch, old, name, record, uuid.uuid4().hex)
        # Announced once stored.
        await self.redis.publish(self.keys.registry_channel, str(version))
        return version

    # -- remote changes ----------------------------------------------------------------------
    async def push_initial(self) -> None:
        """At start: store this node's deploy-dir functions unless Redis already has the same spec."""
        _, records = await self._read()
        for dep in self.registry.list():
            self.specs[dep.key] = dep.spec
            rec = records.get(dep.key)
            if dep.key in self._refused:
                continue   # a record of another protocol version: neither read nor overwritten
            if rec is not None and rec.spec == dep.spec.record() and dep.key not in self._fields:
                self._applied[dep.key] = rec.version
            elif self.publish:
                self._pending[dep.key] = dep.spec
        await self.flush()
        self._epoch = await self.redis.get(self.keys.epoch)  # the one these records are (now) in

    async def _read(self) -> tuple[bytes | str | None, dict[str, Record]]:
        """The shared registry's epoch and records by key, read atomically. A record this node does
        not read (malformed, or stored by a node of another protocol version) is left as it is, in
        `_refused`, and logged once."""
        epoch, flat = await self.redis.eval(_READ, 2, self.keys.functions, self.keys.epoch)
        out: dict[str, Record] = {}
        refused: dict[str, str] = {}
        for field, text in zip(flat[::2], flat[1::2], strict=True):
            try:
                rec = decode_record(field, text)
            except WireError as exc:
                if self._refused.get(field) != exc.message:
                    log.error("cluster: %s; ignored", exc.message)
                refused[field] = exc.message
                continue
            key = field
            if "/" not in field and rec.spec.get("tenant", DEFAULT_TENANT) != DEFAULT_TENANT:
                key = function_key(str(rec.spec["tenant"]), field)  # an older node's record: by its tenant
                self._fields[key] = field
            out[key] = rec
        self._refused = refused
        return epoch, out

    async def sync(self) -> None:
        """Make the local registry match Redis (changes not yet flushed win locally).

        A registry of another epoch than the one this node applied is a Redis that came back empty
        (restarted without persistence) and that some node has begun to fill again: this node's
        functions missing from it are published again, never taken for deleted. A node that knew
        no epoch yet (it began with an empty Redis) takes the first it sees."""
        epoch, records = await self._read()
        if self._republishing or (self._applied and self._epoch is not None and epoch != self._epoch):
            if not self._republishing:
                log.warning("cluster: the registry in Redis was lost; re-publishing this node's functions")
            # Until every function is back (Redis may fail again midway), later syncs keep at it
            # rather than take the functions not yet back for deleted.
            self._republishing = True
            self._applied.clear()
            await self.push_initial()
            self._republishing = False
            epoch, records = await self._read()
        self._epoch = epoch
        for name, rec in records.items():
            if name not in self._pending and self._applied.get(name) != rec.version:
                await self._apply(name, rec)
        for name in list(self._applied):
            if name not in records and name not in self._pending and name not in self._refused:
                self._remove(name)

    async def _apply(self, name: str, rec: Record) -> None:
        self._applied[name] = rec.version
        try:
            spec = FunctionSpec.model_validate(rec.spec)
        except ValueError as exc:
            self._mark_unavailable(name, None, f"invalid record in Redis: {exc}")
            return
        local = await asyncio.to_thread(self._local_code_path, spec, rec.code_path_rel)  # file checks
        spec = spec.model_copy(update={"codePath": local})
        self.specs[name] = spec
        self._applying_specs.add(id(spec))
        try:
            # The async form: a process function's first worker imports the code off the event loop.
            await self.registry.adeploy([spec])
            self.unavailable.pop(name, None)
            log.info("cluster: applied %s (version %d from %s)", name, rec.version, rec.node)
        except FunctionServiceError as exc:
            self._mark_unavailable(name, spec, exc.message)
        finally:
            self._applying_specs.discard(id(spec))

    def _local_code_path(self, spec: FunctionSpec, rel: str | None) -> Path:
        """The same path if this node has the module there, else the same place under a local code root."""
        module = (spec.handler.rpartition(".")[0] if "." in spec.handler else spec.handler).replace(".", "/")
        candidates = [Path(spec.codePath)] + [root / rel for root in self.registry.code_roots if rel is not None]
        for directory in candidates:
            if (directory / f"{module}.py").is_file() or (directory / module).is_dir():
                return directory.resolve()
        return Path(spec.codePath)

    def _mark_unavailable(self, name: str, spec: FunctionSpec | None, reason: str) -> None:
        log.warning("cluster: function %s is unavailable on this node: %s", name, reason)
        if spec is not None:
            self.unavailable[name] = (spec, reason)
        self._drop_local(name)

    def _remove(self, name: str) -> None:
        self._applied.pop(name, None)
        self.specs.pop(name, None)
        self.unavailable.pop(name, None)
        self._drop_local(name)
        log.info("cluster: removed %s", name)

    def _drop_local(self, name: str) -> None:
        if name in self.registry:
            self._applying = True
            try:
                self.registry.delete(name)
            finally:
                self._applying = False

    # -- background --------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="cluster-registry-sync")
        self._listener = asyncio.create_task(self._listen(), name="cluster-registry-listen")

    async def stop(self) -> None:
        await stop_tasks((self._task, self._listener), "cluster registry sync")

    async def _loop(self) -> None:
        backoff = Backoff()
        while True:
            try:
                if not self._pushed:
                    await self.push_initial()
                    self._pushed = True
                await self.flush()
                await self.sync()
                if not self.connected:
                    log.info("cluster: registry in sync with Redis")
                self.connected = True
                backoff.reset()
                checkpoint()
            except (ClusterUnavailableError, *REDIS_DOWN) as exc:
                if self.connected:
                    log.warning("cluster: Redis unreachable (%s); retrying with backoff", exc)
                self.connected = False
                await backoff.sleep()
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except TimeoutError:
                pass
            self._wake.clear()

    async def _listen(self) -> None:
        backoff = Backoff()
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.registry_channel)
                backoff.reset()
                while True:
                    msg = await pubsub.get_message(timeout=5.0)
                    checkpoint()
                    if msg is not None:
                        self._wake.set()
            except REDIS_DOWN:
                await backoff.sleep()
            finally:
                await pubsub.aclose()
