"""The job stores' backends for the contract suites: each test of a contract runs once per kind.

A `Backend` opens stores of its kind on one place (a dict, a file, a redis-server of the test's
own, a Redis Cluster of three masters shared by the module's tests under a key prefix of each
test's own), as a second writer would (another SqliteKeys on the same file and thread, another Redis
client as another node), makes the place refuse writes the way it really does (an SQLite
trigger that aborts, Redis at `maxmemory` with `noeviction`), and reopens a durable one.
"""
from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from runtime.cluster.idempotency_keys import RedisKeys
from runtime.cluster.job_store import RedisJobStore
from runtime.cluster.settings import connect
from runtime.jobs.key_store import KeyStore, MemoryKeys, SqliteKeys
from runtime.jobs.store import JobStore, MemoryJobStore, SqliteJobStore
from tests.support.cluster import RedisClusterServers, require_redis_server
from tests.support.servers import test_config

T = TypeVar("T")
KINDS = ["memory", "sqlite", "redis", "redis-cluster"]
_prefixes = itertools.count()


class Backend:
    """One kind of store on one place; everything it opened is closed at the test's end."""

    def __init__(self, kind: str, path: Path, redis_server: Any) -> None:
        self.kind = kind
        self.durable = kind != "memory"
        self.redis = kind.startswith("redis")  # the Redis stores of cluster mode, on one server or a cluster
        self.path = path / "jobs.sqlite3"
        self.redis_url: str | None = None if redis_server is None else redis_server.url
        self.redis_server = redis_server
        self.prefix = f"contract{next(_prefixes)}"
        self.stores: list[JobStore] = []
        self.clients: list[Any] = []  # the Redis clients of key stores
        self._memory_keys = MemoryKeys()  # memory: one process, one dict of keys
        self._sqlite: SqliteJobStore | None = None

    # -- job stores --------------------------------------------------------------------------
    async def job_store(self, *, lease: float = 15.0, retention: float = 3600) -> JobStore:
        """A new, opened store on this backend's place (Redis: as another node would open it)."""
        store: JobStore
        if self.kind == "memory":
            store = MemoryJobStore()
        elif self.kind == "sqlite":
            store = SqliteJobStore(self.path)
        else:
            assert self.redis_url is not None
            store = RedisJobStore(connect(self.redis_url), self.prefix, retention, lease)
        await store.open()
        if isinstance(store, RedisJobStore):
            await store.renew_lease()  # its writer waits for the first lease
        self.stores.append(store)
        return store

    async def close(self, store: JobStore) -> None:
        if store in self.stores:
            self.stores.remove(store)
            await store.close()

    def node_config(self, deploy: Path, **overrides: Any) -> Any:
        """A serving node's config whose `jobs.store` is this kind on this place (Redis: cluster
        mode, as the Redis store is only ever used; every node of the test shares the key prefix)."""
        sections: dict[str, Any] = {"jobs.store": "redis" if self.redis else self.kind,
                                    "frontend.args.shutdownGraceSeconds": 0.5}
        if self.kind == "sqlite":
            sections["jobs.path"] = str(self.path)
        if self.redis:
            sections.update({"cluster.redisUrl": self.redis_url, "cluster.keyPrefix": self.prefix,
                             "cluster.workerHeartbeatSeconds": 0.2, "jobs.takeoverSeconds": 0.5})
        return test_config(deploy, **{**sections, **overrides})

    # -- key stores --------------------------------------------------------------------------
    async def key_store(self) -> KeyStore:
        """A KeyStore on this backend's place; a second call is a second writer of the same keys."""
        keys: KeyStore
        if self.kind == "memory":
            keys = self._memory_keys
        elif self.kind == "sqlite":
            if self._sqlite is None:
                self._sqlite = SqliteJobStore(self.path)
                await self._sqlite.open()
                self.stores.append(self._sqlite)
            keys = SqliteKeys(self._sqlite)
        else:
            assert self.redis_url is not None
            client = connect(self.redis_url)
            self.clients.append(client)
            keys = RedisKeys(client, self.prefix)
        await keys.open()
        return keys

    async def reopen_keys(self) -> KeyStore:
        """Close the keys' store and open it again (a restart): SQLite only; Redis is shared anyway."""
        if self._sqlite is not None:
            await self.close(self._sqlite)
            self._sqlite = None
        return await self.key_store()

    async def stored_keys(self) -> int:
        """How many keys the place holds (expired ones not yet purged included)."""
        if self.kind == "memory":
            return len(self._memory_keys._keys)
        if self.kind == "sqlite":
            assert self._sqlite is not None
            return await self._sqlite._run(lambda db: db.execute("SELECT count(*) FROM idempotency").fetchone()[0])
        return sum(_on_masters(self.redis_server, lambda master: len(master.keys(f"{self.prefix}:idem:*"))))

    # -- refusals ----------------------------------------------------------------------------
    def _sqlite_store(self, store: JobStore | None) -> SqliteJobStore:
        found = store if store is not None else next(s for s in self.stores if isinstance(s, SqliteJobStore))
        assert isinstance(found, SqliteJobStore)
        return found

    async def refuse_writes(self, store: JobStore | None = None) -> None:
        """From now on the place refuses every write, as a full disk or a full Redis does (SQLite:
        on the file of `store`, else of the store this backend opened)."""
        if self.kind == "memory":
            pytest.skip("the memory store holds nothing that can refuse a write")
        if self.kind == "sqlite":
            sqlite = self._sqlite_store(store)

            def triggers(db: Any) -> None:
                tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
                for table in tables:
                    for op in ("INSERT", "UPDATE", "DELETE"):
                        db.execute(f"CREATE TRIGGER refuse_{op.lower()}_{table} BEFORE {op} ON {table} "
                                   "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")

            await sqlite._run(triggers)
        else:
            _on_masters(self.redis_server, lambda master: master.config_set("maxmemory-policy", "noeviction"))
            _on_masters(self.redis_server, lambda master: master.config_set("maxmemory", "1"))

    async def take_writes(self, store: JobStore | None = None) -> None:
        """The place takes writes again."""
        if self.kind == "sqlite":
            sqlite = self._sqlite_store(store)

            def drop(db: Any) -> None:
                names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
                for name in names:
                    db.execute(f"DROP TRIGGER {name}")

            await sqlite._run(drop)
        elif self.redis:
            _on_masters(self.redis_server, lambda master: master.config_set("maxmemory", "0"))


def _on_masters(server: Any, command: Callable[[redis.Redis], T]) -> list[T]:
    """`command` on each Redis master, through a plain client of its own (a RedisCluster client
    sends KEYS and CONFIG SET to one node only)."""
    if not isinstance(server, RedisClusterServers):
        return [command(server.client())]
    answers = []
    for port in server.ports:
        with redis.Redis(port=port, decode_responses=True) as master:
            answers.append(command(master))
    return answers


@pytest.fixture(scope="module")
def module_redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """One Redis Cluster for the module's tests (each test its own key prefix): three masters
    take a few seconds to join, too long to make again for each test."""
    require_redis_server()
    servers = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"))
    yield servers
    servers.kill()


@pytest.fixture(params=KINDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    fixture = {"redis": "redis_server", "redis-cluster": "module_redis_cluster"}.get(request.param)
    server = None if fixture is None else request.getfixturevalue(fixture)
    place = Backend(request.param, tmp_path, server)
    yield place
    if server is not None:
        await place.take_writes()
    for store in reversed(place.stores):
        await store.close()
    for client in place.clients:
        await client.aclose()
