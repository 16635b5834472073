"""Redis commands packed by hiredis's C packer instead of redis-py's asyncio one, in Python.

redis-py's asyncio connections pack every command in Python, an argument at a time (encode, then
a join that copies the whole command so far), while its sync connections use hiredis: a queue
entry of some twenty fields cost the frontend ~30 µs to pack, hiredis ~4 µs, and the worker
packs as much per call. `use_hiredis_packing` gives a client's connections hiredis's packer
(what the sync client's HiredisRespSerializer does): the same bytes on the wire (str as UTF-8,
int and float as their repr, bytes and memoryview as they are), and the same DataError for an
argument of another type (a bool).
"""
from __future__ import annotations

from typing import Any

import hiredis  # (a dependency: redis[hiredis])
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection
from redis.exceptions import DataError
from redis.typing import EncodableT

__all__ = ("pack", "use_hiredis_packing")

_made: dict[type[Any], type[Any]] = {}


def pack(args: tuple[EncodableT, ...]) -> bytes:
    """One command, packed by hiredis; the command name split as redis-py splits it."""
    first = args[0]
    if isinstance(first, str):
        if " " in first:   # e.g. "CONFIG GET": the server wants the words as arguments
            args = (*first.encode().split(), *args[1:])
    elif isinstance(first, bytes) and b" " in first:
        args = (*first.split(), *args[1:])
    try:
        packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # (its stub: one-tuples)
        return packed
    except TypeError as exc:
        raise DataError(str(exc)) from None


class _HiredisPacking(AbstractConnection):
    """The mixin: hiredis packs, in one buffer."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return [pack(args)]


def _fast(cls: type[Any]) -> type[Any]:
    if issubclass(cls, _HiredisPacking):
        return cls
    made = _made.get(cls)
    if made is None:
        made = _made[cls] = type(f"Hiredis{cls.__name__}", (_HiredisPacking, cls), {})
    return made


def use_hiredis_packing(client: Any) -> None:
    """Before the client's first command: its connections (every node's, for a Redis Cluster) pack
    with hiredis. Their class is otherwise the one the URL chose (TCP, TLS, a Unix socket)."""
    if isinstance(client, RedisCluster):
        manager = client.nodes_manager
        kwargs = manager.connection_kwargs
        kwargs["connection_class"] = _fast(kwargs.get("connection_class") or Connection)
        for node in manager.startup_nodes.values():
            node.connection_class = _fast(node.connection_class)
        return
    pool = client.connection_pool
    pool.connection_class = _fast(pool.connection_class)

