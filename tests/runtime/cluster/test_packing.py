"""The cluster's Redis clients pack commands with hiredis (runtime/cluster/packing.py): the same
bytes redis-py's own packer writes, the same error for an argument it refuses, over one Redis
server and every node of a Redis Cluster."""
from __future__ import annotations

import pytest
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import DataError

from runtime.cluster.packing import _HiredisPacking
from runtime.cluster.settings import connect

ARGS = [("SET", "k", "välue"), ("XADD", "s", "*", "n", 12, "f", 0.1, "big", 2**70, "b", b"\x00\xff", "m",
        memoryview(b"mv")), ("CONFIG GET", "maxmemory"), (b"CLIENT LIST",), ("SET", "k", "x" * 10_000)]


async def test_one_server_packs_as_redis_py_does(redis_server):
    r = connect(redis_server.url)
    try:
        conn = r.connection_pool.make_connection()
        assert isinstance(conn, _HiredisPacking)
        for args in ARGS:
            assert b"".join(conn.pack_command(*args)) == b"".join(AbstractConnection.pack_command(conn, *args))
        with pytest.raises(DataError):
            conn.pack_command("SET", "k", True)
        await r.xadd("s", {"n": 12, "f": 0.5, "t": "välue"})   # and the server reads it
        assert (await r.xrange("s"))[0][1] == {"n": "12", "f": "0.5", "t": "välue"}
        assert await r.config_get("maxmemory")
    finally:
        await r.aclose()


async def test_every_cluster_node_packs_with_hiredis(redis_cluster):
    r = connect(redis_cluster.url)
    try:
        for i in range(20):   # keys on every node
            await r.set(f"k{i}", f"välue{i}")
        assert [await r.get(f"k{i}") for i in range(20)] == [f"välue{i}" for i in range(20)]
        nodes = r.get_nodes()
        assert len(nodes) > 1
        assert all(issubclass(node.connection_class, _HiredisPacking) for node in nodes)
    finally:
        await r.aclose()
