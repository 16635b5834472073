"""runtime.dispatch: the one entry point finds, checks the tenant and runs; the invocation it
returns answers through the InvocationSurface (encoded result, generator items aggregated)."""
from __future__ import annotations

import json

import pytest

from runtime.dispatch import Dispatcher, InvokeOptions
from runtime.errors import ForbiddenError, FunctionNotFoundError
from runtime.executor import Executor
from runtime.manifest import parse_manifest
from runtime.principal import Principal
from runtime.registry import Registry
from tests.support.servers import HANDLERS


@pytest.fixture
async def dispatcher():
    registry = Registry([HANDLERS])
    manifest = json.dumps([{"name": "none-d", "handler": "testfns.returns_none", "codePath": str(HANDLERS)},
                           {"name": "gen-d", "handler": "testfns.gen", "codePath": str(HANDLERS), "tenant": "acme"}])
    await registry.adeploy(parse_manifest(manifest, "test", HANDLERS))
    executor = Executor(4)
    yield Dispatcher(registry, executor)
    await registry.stop_workers(0)
    executor.shutdown()


async def test_dispatch_checks_the_tenant_whether_given_a_name_or_a_found_function(dispatcher):
    acme, other = Principal("acme", "user"), Principal("default", "user")
    with pytest.raises(ForbiddenError, match="tenant 'default' may not use function 'gen-d'"):
        await dispatcher.dispatch(other, "gen-d", {})
    found = dispatcher.find(acme, "gen-d")
    with pytest.raises(ForbiddenError):
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
