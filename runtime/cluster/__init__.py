"""Cluster mode: several fnstream nodes sharing a function registry and a work queue in Redis.

Without `cluster.redisUrl` none of this is imported and fnstream needs no Redis.
"""
from .node import ClusterNode
from .settings import ClusterUnavailableError, Keys, WorkerLostError, connect

__all__ = ("ClusterNode", "ClusterUnavailableError", "Keys", "WorkerLostError", "connect")
