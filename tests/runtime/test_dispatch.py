"""runtime.dispatch: the one entry point finds, checks the tenant and runs; the invocation it
returns answers through the InvocationSurface (encoded result, generator items aggregated)."""
from __future__ import annotations

import json

import pytest

from runtime.dispatch import Dispatcher, InvokeOptions
from runtime.errors import FunctionNotFoundError, ServiceUnavailableError
from runtime.executor import Executor
from runtime.jobs.model import Job, JobRequest
from runtime.manifest import parse_manifest
from runtime.principal import Principal
from runtime.registry import Registry
from tests.support.servers import HANDLERS


@pytest.fixture
def specs():
    """Parsed before the loop runs (resolving codePath touches the file system)."""
    manifest = json.dumps([{"name": "none-d", "handler": "testfns.returns_none", "codePath": str(HANDLERS)},
                           {"name": "gen-d", "handler": "testfns.gen", "codePath": str(HANDLERS), "tenant": "acme"}])
    return parse_manifest(manifest, "test", HANDLERS)


@pytest.fixture
async def dispatcher(specs):
    registry = Registry([HANDLERS])
    await registry.adeploy(specs)
    executor = Executor(4)
    yield Dispatcher(registry, executor)
    await registry.stop_workers()
    executor.shutdown()


async def test_dispatch_checks_the_tenant_whether_given_a_name_or_a_found_function(dispatcher):
    acme, other = Principal("acme", "user"), Principal("default", "user")
    with pytest.raises(FunctionNotFoundError, match=r"^function 'gen-d' is not deployed$"):  # names no tenant
        await dispatcher.dispatch(other, "gen-d", {})
    found = dispatcher.find(acme, "gen-d")
    with pytest.raises(FunctionNotFoundError, match=r"^function 'gen-d' is not deployed$"):
        await dispatcher.dispatch(other, found, {})  # a function found for one principal is not another's
    with pytest.raises(FunctionNotFoundError):
        dispatcher.find(None, "nope")
    inv = await dispatcher.dispatch(None, found, {"n": 2})  # auth off: no principal, no check
    assert await inv.encoded_result() == '[{"i":0},{"i":1}]'  # a plain JSON call aggregates the items


async def test_encoded_result_by_mode(dispatcher):
    inv = await dispatcher.dispatch(None, "none-d", {}, InvokeOptions(mode="json", inline=True))
    assert inv.streaming is False and await inv.encoded_result() == "null"  # its write is dropped
    inv = await dispatcher.dispatch(None, "none-d", {}, InvokeOptions(mode="sse", trace_id="t-1"))
    assert inv.trace_id == "t-1" and inv.streaming
    assert await inv.channel.get_batch() == ["only"] and await inv.channel.get_batch() == []
    assert await inv.encoded_result() is None  # it returned None: nothing follows the stream
    inv = await dispatcher.dispatch(Principal("acme", "user"), "gen-d", {"n": 2}, InvokeOptions(mode="sse"))
    batches = []
    while batch := await inv.channel.get_batch():
        batches.extend(batch)
    assert batches == ['{"i":0}', '{"i":1}'] and await inv.encoded_result() is None


class _Queue:
    """A job queue that records what reached it (the JobManager's place behind submit_job)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, object, JobRequest]] = []

    async def submit(self, function, event, request):
        self.got.append((function.spec.name, event, request))
        return Job(id="j-1", function=function.spec.name, tenant=function.spec.tenant, event=event, api=request.api)


async def test_submit_job_checks_the_tenant_then_hands_the_job_to_the_queue(dispatcher):
    with pytest.raises(ServiceUnavailableError, match="no background jobs"):
        await dispatcher.submit_job(None, "gen-d", {}, JobRequest())
    queue = _Queue()
    with_jobs = Dispatcher(dispatcher.registry, dispatcher.executor, jobs=lambda d: queue)
    assert with_jobs.jobs is queue  # made once, with the dispatcher it runs its jobs through
    dispatcher = with_jobs
    request = JobRequest(api="runpod", execution_timeout=1.5)
    with pytest.raises(FunctionNotFoundError, match=r"^function 'gen-d' is not deployed$"):
        await dispatcher.submit_job(Principal("default", "user"), "gen-d", {}, request)
    with pytest.raises(FunctionNotFoundError):
        await dispatcher.submit_job(Principal("default", "user"), dispatcher.find(None, "gen-d"), {}, request)
    job = await dispatcher.submit_job(Principal("acme", "user"), "gen-d", {"n": 1}, request)
    assert job.tenant == "acme" and queue.got == [("gen-d", {"n": 1}, request)]


async def test_job_options_shorten_the_deadline_and_keep_generator_values(dispatcher):
    inv = await dispatcher.dispatch(None, "gen-d", {"n": 2}, InvokeOptions(mode="sse", keep_items=True, timeout=2.5))
    assert inv.deadline - inv.started == pytest.approx(2.5)  # the function's own timeout is longer
    items = []
    while batch := await inv.channel.get_batch():
        items.extend(batch)
    assert items == ['{"i":0}', '{"i":1}'] and [i.value for i in items] == [{"i": 0}, {"i": 1}]
    inv = await dispatcher.dispatch(None, "gen-d", {"n": 1}, InvokeOptions(mode="sse", timeout=10_000))
    assert inv.deadline - inv.started == pytest.approx(inv.spec.timeout)  # never beyond the function's


async def test_a_forwarding_kind_takes_the_calls_it_says_it_takes(dispatcher):
    """A kind whose calls run on another node (as `remote` does in cluster mode) is one ExecutorKind
    with a forwarder, handed to the Executor: dispatch sends it what it takes, runs the rest here."""
    from runtime.executors import ExecutorKind

    sent = []

    class Elsewhere:
        def __init__(self, membership):
            self.membership = membership

        def takes(self, function):
            return function.spec.name == "none-d"

        async def submit(self, function, event, options, limits):
            sent.append((self.membership, function.spec.name, event, options.mode, limits.buffer_events))
            return "relayed"

    kind = ExecutorKind("elsewhere", in_process=False, selectable=False, forwarder=Elsewhere)
    dispatcher.executor.forward(kind, "the node's membership")
    assert await dispatcher.dispatch(None, "none-d", {"x": 1}, InvokeOptions(mode="sse")) == "relayed"
    assert sent == [("the node's membership", "none-d", {"x": 1}, "sse", dispatcher.limits.buffer_events)]
    function = dispatcher.find(None, "none-d")
    assert dispatcher.plain(None, function, {}, "t" * 32) is None   # a plain call of it is forwarded too
    inv = await dispatcher.dispatch(Principal("acme", "user"), "gen-d", {"n": 1})   # not taken: runs here
    assert await inv.encoded_result() == '[{"i":0}]'
