"""The `remote` kind: a call the cluster's worker nodes run (runtime/executors.py registers it).

Its forwarder, `ClusterRunner`, takes a call when this node does not run handlers (`role:
frontend`), cannot load the function's code (deployment.RemoteFunction) or has the function at its
concurrency (ClusterNode.should_enqueue), and queues it (ClusterNode.submit): what the caller gets
is a RemoteInvocation relaying what the worker node writes. The worker node runs the call with its
own kind of the function; the frontend's deadline watchdog leaves it alone (`own_deadline`: the
relay gives up DEADLINE_GRACE past the deadline itself). The composition root (runtime/node.py)
hands the cluster node to the Executor (`Executor.forward`), which makes the forwarder.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..executors import ExecutorKind

if TYPE_CHECKING:
    from runtime.deployment import FunctionRef
    from runtime.dispatch import InvokeOptions, Limits

    from .node import ClusterNode
    from .queue import RemoteInvocation

__all__ = ("REMOTE", "ClusterRunner")


class ClusterRunner:
    """The remote kind's Forwarder (runtime/executors.py): calls queued for the cluster's workers."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    def takes(self, function: FunctionRef) -> bool:
        return self.node.should_enqueue(function)

    async def submit(self, function: FunctionRef, event: Any, options: InvokeOptions,
                     limits: Limits) -> RemoteInvocation:
        return await self.node.submit(function, event, mode=options.mode, buffer_events=limits.buffer_events,
                                      max_write_size=limits.max_write_size,
                                      max_response_size=limits.max_response_size, trace_id=options.trace_id,
                                      timeout=options.timeout, buffer_bytes=limits.buffer_bytes,
                                      keep_items=options.keep_items, accepted=options.accepted,
                                      invocation_id=options.invocation_id)


REMOTE = ExecutorKind("remote", in_process=False, own_deadline=True, selectable=False, forwarder=ClusterRunner)
