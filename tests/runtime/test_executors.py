"""The table of executor kinds (runtime/executors.py): every name resolves to its kind, and a
deployment runs where its kind says — no module branches on a kind's name."""
import pytest

from runtime.cluster.kind import ClusterRunner
from runtime.deployment import Deployment, RemoteFunction
from runtime.executors import KINDS, SELECTABLE, kind_named, kind_of
from runtime.manifest import FunctionSpec
from runtime.process.executor import ProcessExecutor
from runtime.process.pool import WorkerPool


def _spec(**fields):
    return FunctionSpec.model_validate({"name": "f", "handler": "m.f", **fields})


def test_every_name_of_the_table_is_its_kind():
    for name in list(KINDS):
        kind = kind_named(name)
        assert kind.name == name
        assert kind.in_process == (kind.runner is None and name in ("async", "thread"))
    assert set(SELECTABLE) == {k for k in KINDS if kind_named(k).selectable}


def test_a_spec_names_its_kind_before_any_code_is_loaded():
    assert kind_of(_spec()) is None  # the handler's kind decides: async or thread
    assert kind_of(_spec(executor="thread")) is kind_named("thread")
    process = kind_of(_spec(executor="process"))
    assert process is kind_named("process") and process.pool is WorkerPool and process.runner is ProcessExecutor
    java = kind_of(_spec(runtime="java17", handler="com.example.Fn::handle", executor=None))
    assert java is kind_named("java") and java.pooled and not java.selectable and java.runner is ProcessExecutor


def test_deployments_and_remote_functions_carry_their_kind():
    dep = Deployment(_spec(executor="process"), None)
    assert dep.runs is kind_named("process") and not dep.in_process and dep.executor == "process"
    remote = RemoteFunction(_spec(), "no such module here")
    assert remote.runs is kind_named("remote") and not remote.in_process and remote.runs.runner is None
    assert remote.runs.forwarder is ClusterRunner   # its calls go to the cluster's worker nodes


def test_a_manifest_names_only_a_selectable_kind():
    with pytest.raises(ValueError, match="Input should be 'async', 'thread' or 'process'"):
        _spec(executor="java")
    with pytest.raises(ValueError, match="Input should be"):
        _spec(executor="remote")
