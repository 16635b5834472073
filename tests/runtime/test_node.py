"""The composition root (runtime/node.py): one Node builds every runtime object from the config,
each given what it needs when it is made, and `async with` runs them in order."""
import pytest

from runtime.errors import ConfigError
from runtime.node import Node
from runtime.streams.api import current_broker
from tests.support.servers import test_config

QUOTAS = {"tenants.maxFunctions": 5, "tenants.maxInstancesPerFunction": 4, "runtime.maxWorkerProcesses": 3,
          "jobs.store": "memory"}


def test_a_serving_node_is_wired_at_construction():
    node = Node(test_config(**QUOTAS))
    assert node.cluster is None and node.role == "all"
    assert node.dispatcher.jobs is node.jobs is not None and node.dispatcher.cluster is None
    assert node.jobs.dispatcher is node.dispatcher and node.jobs.store is node.store
    assert node.webhooks is not None and node.webhooks.job_ended in node.jobs.on_final
    assert node.outputs is not None and node.outputs.broker is node.broker and node.outputs.send_cancel is None
    assert node.lifecycle.stop_intake == (node.jobs.stop_taking,)
    assert node.registry.quotas.max_worker_processes == 3


def test_job_end_hooks_are_given_at_construction():
    """The job manager's end hooks come with it, in order (webhooks first); none is added later."""
    ended = []
    node = Node(test_config(**QUOTAS), job_hooks=(ended.append,))
    assert node.jobs is not None and node.webhooks is not None
    assert node.jobs.on_final == (node.webhooks.job_ended, ended.append)
    assert not hasattr(node.jobs.on_final, "append")


def test_a_worker_node_has_the_nodes_quotas_and_no_jobs():
    """`fnstream worker`'s registry had no quotas and no worker-process budget (issue 24)."""
    node = Node(test_config(**QUOTAS, **{"cluster.redisUrl": "redis://127.0.0.1:9/0"}), worker_only=True)
    quotas = node.registry.quotas
    assert (quotas.max_functions, quotas.max_instances, quotas.max_worker_processes) == (5, 4, 3)
    assert node.registry.workers.limit == 3
    assert node.cluster is not None and node.role == "worker" and node.broker is node.cluster.broker
    [remote] = node.executor._forwarders   # the remote kind's calls go to the cluster's workers
    assert remote.node is node.cluster
    assert node.dispatcher.cluster is node.cluster
    assert node.jobs is None and node.store is None and node.outputs is None and node.dispatcher.jobs is None
    assert node.lifecycle.stop_intake == (node.cluster.stop_taking,)


def test_a_worker_node_needs_cluster_mode():
    with pytest.raises(ConfigError, match="needs cluster mode"):
        Node(test_config(), worker_only=True)


async def test_async_with_runs_the_node_and_leaving_shuts_it_down():
    node = Node(test_config(**QUOTAS))
    async with node:
        assert current_broker()[0] is node.broker  # handlers' named streams reach this node's broker
        assert not node.jobs.stopping
    assert node.jobs.stopping  # intake stopped, then the manager
    assert node.lifecycle._closed
    with pytest.raises(RuntimeError):
        current_broker()
