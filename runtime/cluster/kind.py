"""A function this node only knows from the cluster (deployment.RemoteFunction: its code cannot be
loaded here): its invocations are queued for the worker nodes. The Dispatcher hands them to the
cluster node (`ClusterNode.submit`, a RemoteInvocation relaying what the worker node writes), so
the kind has no runner of its own here; the worker node runs its own kind of it."""
from __future__ import annotations

from ..executors import ExecutorKind

__all__ = ("REMOTE",)

REMOTE = ExecutorKind("remote", in_process=False, own_deadline=True, selectable=False)
