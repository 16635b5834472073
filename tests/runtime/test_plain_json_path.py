"""Plain JSON calls run in the request's own task and build no output channel unless used: their
endings (timeout, late writes, a client leaving) must behave exactly as before, for `def` handlers too."""
import asyncio

from frontend.keys import REGISTRY
from tests.support.servers import fn, test_config


def state_of(client, name):
    return client.server.app[REGISTRY].get(name).code.handler.__globals__["STATE"]


async def wait_for(predicate, timeout=3.0, step=0.02):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return predicate()


async def test_plain_json_thread_handler_timeout_refuses_its_later_writes(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("slowj", "testfns.stubborn_sleep_then_write", timeout=0.2))))
    resp = await client.post("/serverless/v1/functions/slowj/invocations", json={"seconds": 0.5})
    assert resp.status == 504
    body = await resp.json()
    assert body["code"] == 4010 and "timed out" in body["message"]
    assert resp.headers["X-Inner-Code"] == "4010" and resp.headers["X-Request-Id"] == body["trace_id"]
    # The stream the thread asks for after the deadline refuses the write (its channel is made then).
    assert await wait_for(lambda: ("late-write", "StreamClosedError") in state_of(client, "slowj")["log"])
    dep = client.server.app[REGISTRY].get("slowj")
    assert await wait_for(lambda: dep.inflight == 0)


async def test_plain_json_thread_handler_keeps_its_slot_until_the_thread_ends(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("sleept", "testfns.sync_sleep", concurrency=1))))
    task = asyncio.ensure_future(client.post("/serverless/v1/functions/sleept/invocations", json={"seconds": 2}))
    dep = client.server.app[REGISTRY].get("sleept")
    assert await wait_for(lambda: dep.inflight == 1)
    task.cancel()  # the client leaves; the thread cannot be stopped
    await asyncio.sleep(0.1)
    refused = await client.post("/serverless/v1/functions/sleept/invocations", json={"seconds": 0})
    assert refused.status == 429  # the abandoned thread still holds the only slot
    assert await wait_for(lambda: dep.inflight == 0, timeout=5)
    resp = await client.post("/serverless/v1/functions/sleept/invocations", json={"seconds": 0})
    assert resp.status == 200 and await resp.json() == "woke"
    assert resp.headers["X-Inner-Code"] == "0" and resp.headers["Content-Type"] == "application/json; charset=utf-8"


def test_a_cycle_in_a_result_is_refused_even_under_a_raised_recursion_limit():
    """The shared encoder has no cycle check (the recursion limit stops a cycle); a handler that
    raised the limit (some libraries do) gets the checked encoder, not a crash in the C stack."""
    import subprocess
    import sys

    code = ("import sys; sys.setrecursionlimit(10**6)\n"
            "from runtime.codec import encode_json, encode_payload\n"
            "from runtime.errors import ResultNotSerializableError, StreamWriteError\n"
            "a = []; a.append(a)\n"
            "for encode, refused in ((encode_json, ResultNotSerializableError), (encode_payload, StreamWriteError)):\n"
            "    try:\n"
            "        encode(a)\n"
            "    except refused as exc:\n"
            "        print(type(exc).__name__, exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("Circular reference detected") == 2, proc.stdout


def test_a_cycle_at_the_default_limit_is_refused_as_not_json():
    from runtime.codec import encode_json
    from runtime.errors import ResultNotSerializableError

    cycle: dict = {}
    cycle["self"] = cycle
    try:
        encode_json(cycle)
    except ResultNotSerializableError as exc:
        assert exc.code == 4007
    else:
        raise AssertionError("a cycle was encoded")
    assert encode_json({"a": [1, 2.5, "é"]}) == '{"a":[1,2.5,"é"]}'  # the encoder is whole after a failure


async def test_a_plain_call_names_its_ids_and_checks_its_writes_through_both_doors(aiohttp_client, deploy_dir):
    """A plain call (runtime/plain.py) through the fast lane and through the app's route: the context
    names the answer's X-Invocation-Id and trace id; a write is dropped, one that is not JSON raises."""
    from aiohttp.test_utils import TestServer

    from frontend.app import build_app
    from tests.support.servers import FnstreamTestServer

    config = test_config(deploy_dir(fn("pw", "testfns.plain_writes", timeout=30),
                                    fn("ctx", "testfns.context_info")), **{"jobs.store": "memory"})
    for server in (FnstreamTestServer(build_app(config)), TestServer(build_app(config))):
        client = await aiohttp_client(server)
        resp = await client.post("/serverless/v1/functions/pw/invocations", json={})
        assert resp.status == 200
        body = await resp.json()
        assert body["refused"] == "StreamWriteError"
        assert body["invoke_id"] == resp.headers["X-Invocation-Id"] and len(body["invoke_id"]) == 22
        assert body["trace_id"] == resp.headers["X-Trace-Id"] == resp.headers["X-Request-Id"]
        assert 0 < body["remaining_ms"] <= 30_000
        resp = await client.post("/serverless/v1/functions/ctx/invocations", json={})
        info = await resp.json()
        assert info["invoke_id"] == resp.headers["X-Invocation-Id"] and info["tenant"] == "default"
        assert client.server.app[REGISTRY].get("pw").inflight == 0
