"""Shared pieces of cluster mode: the Redis key layout, the connection, errors and backoff.

Every key is hash-tagged (`{...}`) by what it belongs to (the registry, one function's queue, one
invocation), so each lives on a single Redis Cluster slot and multi-key commands stay legal.
A `redis+cluster://HOST:PORT` URL (any one node of the cluster) selects redis-py's cluster
client; `redis://` is one Redis server.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runtime.errors import FunctionServiceError, ServiceUnavailableError

from .packing import use_hiredis_packing

__all__ = ("Keys", "connect", "node_id", "ClusterUnavailableError", "WorkerLostError", "OutputLostError", "REDIS_DOWN",
           "Backoff", "describe_url", "is_cluster_url", "slot_of", "through_outage")

# What a lost Redis connection looks like to redis-py (OSError covers refused connects; the
# cluster client raises RedisClusterException when no startup node answers, ClusterError when
# the cluster is down).
REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError, ClusterError, RedisClusterException)
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


class ClusterUnavailableError(ServiceUnavailableError):
    """Work that needs Redis was asked for while Redis is unreachable (503, inner code 200503)."""


class WorkerLostError(FunctionServiceError):
    """The worker running an invocation died after its output had begun."""

    code, status = 4002, 502


class OutputLostError(WorkerLostError):
    """Part of an invocation's output never reached the frontend (gone from Redis on the way)."""


class Keys:
    """Names of every Redis key and channel fnstream uses, under one prefix."""

    GROUP = "workers"

    def __init__(self, prefix: str = "fnstream") -> None:
        self.prefix = prefix
        self.functions = f"{prefix}:{{registry}}:functions"   # hash name -> JSON record
        self.version = f"{prefix}:{{registry}}:version"       # counter bumped on every change
        self.epoch = f"{prefix}:{{registry}}:epoch"           # set by the first store into an empty Redis
        self.registry_channel = f"{prefix}:registry"          # pub/sub: "something changed"
        self.cancel_channel = f"{prefix}:cancel"              # pub/sub: invocation ids to cancel

    def queue(self, function: str) -> str:
        return f"{self.prefix}:{{queue:{function}}}"

    def answers(self, node: str) -> str:
        """A frontend node's answers stream: the results of its plain JSON invocations (answers.py)."""
        return f"{self.prefix}:{{answers:{node}}}"

    def output(self, inv_id: str) -> str:
        return f"{self.prefix}:{{inv:{inv_id}}}:out"

    def ack(self, inv_id: str) -> str:
        return f"{self.prefix}:{{inv:{inv_id}}}:ack"

    def ack_chars(self, inv_id: str) -> str:
        return f"{self.prefix}:{{inv:{inv_id}}}:ackc"

    def cancelled(self, inv_id: str) -> str:
        return f"{self.prefix}:{{inv:{inv_id}}}:cancel"

    def taken(self, inv_id: str) -> str:
        """Which worker took the invocation, and which queue entry of it (worker_intake.py _take)."""
        return f"{self.prefix}:{{inv:{inv_id}}}:taken"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def workers_pattern(self) -> str:
        return f"{self.prefix}:worker:*"


def node_id(kind: str) -> str:
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def describe_url(url: str) -> str:
    """The URL without a password, for messages."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


# A client of one Redis server or of a Redis Cluster: every cluster module takes either.
AnyRedis = aioredis.Redis | RedisCluster


def connect(url: str, *, decode: bool = True) -> AnyRedis:
    """An asyncio client that fails fast (two quick retries) so callers can answer 503 at once:
    a RedisCluster for `redis+cluster://` (it discovers every node from the one given), else a Redis."""
    # redis.asyncio.retry.Retry: the sync redis.retry.Retry returns the coroutine unawaited, so an
    # asyncio client given one never retries, and a pooled connection a Redis restart left stale
    # failed its next command (503) instead of reconnecting.
    common: dict[str, Any] = dict(decode_responses=decode, socket_connect_timeout=2, socket_timeout=10,
                                  health_check_interval=5,
                                  retry=AsyncRetry(ExponentialBackoff(cap=0.2, base=0.05), 2))
    if is_cluster_url(url):
        scheme, _, rest = url.partition("://")
        host = rest.partition("/")[0]          # a Redis Cluster has only database 0
        client: AnyRedis = RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme.lower()]}://{host}", **common)
    else:
        client = aioredis.Redis.from_url(url, **common)
    use_hiredis_packing(client)   # its commands packed in C, not in Python (packing.py)
    return client


def slot_of(redis: AnyRedis, key: str) -> int:
    """The key's cluster slot (keys of one slot may share a multi-key command); 0 on a single Redis."""
    return redis.keyslot(key) if isinstance(redis, RedisCluster) else 0


class Backoff:
    """Exponential backoff for background loops that lost Redis: 0.1 s doubling up to 2 s."""

    def __init__(self, first: float = 0.1, cap: float = 2.0) -> None:
        self.first, self.cap, self.delay = first, cap, first

    def reset(self) -> None:
        self.delay = self.first

    async def sleep(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.cap, self.delay * 2)


T = TypeVar("T")


async def through_outage(call: Callable[[], Awaitable[T]], deadline: float, *, cap: float = 0.5) -> T:
    """`call()`, made again after a backoff (0.05 s doubling to `cap`) while Redis is unreachable,
    until `deadline` (time.monotonic()): then the last error. A Redis restart of a few seconds is
    then a delay, not a failure of what was accepted. Only for commands that are idempotent or
    whose repetition the reader discards (an output entry carries its index, an answer its id)."""
    backoff = Backoff(0.05, cap)
    while True:
        try:
            return await call()
        except REDIS_DOWN:
            if time.monotonic() + backoff.delay > deadline:
                raise
            await backoff.sleep()
