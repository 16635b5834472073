"""Durable SSE output (runtime/durable.py, frontend/routes/invocations.py), over real sockets: an
invocation's events read again by its X-Invocation-Id, after a drop (onDisconnect: continue) or
after the end; cancel by id; other tenants see nothing.

The handlers (tests/handlers/durable_fns.py) write event i only once the test released it, so each
test knows how far the producer is when an event arrives: no timing."""
from __future__ import annotations

import asyncio
import json

import pytest

from frontend.client import iter_sse
from frontend.keys import REGISTRY
from tests.support.servers import fn, test_config

INVOKE = "/serverless/v1/functions/{}/invocations".format
EVENTS = "/serverless/v1/invocations/{}/events".format
CANCEL = "/serverless/v1/invocations/{}/cancel".format
SSE = {"Accept": "text/event-stream"}
DOORS = {"fast lane": {}, "app path": {"Origin": "http://page.example"}}
TOKENS = [{"token": "user-a", "tenant": "default", "role": "user"},
          {"token": "user-b", "tenant": "acme", "role": "user"},
          {"token": "root", "tenant": "ops", "role": "admin"}]


def _config(deploy_dir, **overrides):
    deploy = deploy_dir(fn("gated", "durable_fns.gated"), fn("kept", "durable_fns.gated", onDisconnect="continue"),
                        fn("short", "durable_fns.gated", onDisconnect="continue", timeout=0.5),
                        fn("ticker", "testfns.sync_ticker"), fn("mid", "testfns.raise_mid"))
    return test_config(deploy, **{"frontend.args.enableEvent": True,
                                  "frontend.cors.allowOrigins": ["http://page.example"], **overrides})


@pytest.fixture
async def client(make_client, deploy_dir):
    return await make_client(_config(deploy_dir))


def _state(client, function, marker):
    module = client.server.app[REGISTRY].get(function).code.handler.__globals__  # each deployment's own module
    return module["state"](marker)


async def _until(check, what):
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


def _without_pings(body: bytes) -> bytes:
    return b"".join(line for line in body.splitlines(keepends=True) if not line.startswith(b":"))


# -- replay after the end ----------------------------------------------------------------------

@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("function, body", [("ticker", {"count": 4, "delay_ms": 1}), ("mid", {})])
async def test_an_ended_invocation_reads_again_as_it_was_answered(client, door, function, body):
    resp = await client.post(INVOKE(function), json=body, headers={**SSE, **DOORS[door]})
    original = await resp.read()
    inv_id = resp.headers["X-Invocation-Id"]
    again = await client.get(EVENTS(inv_id))
    assert again.status == 200 and again.headers["Content-Type"].startswith("text/event-stream")
    assert again.headers["X-Invocation-Id"] == inv_id
    assert _without_pings(await again.read()) == original  # same events, same ids, result, [DONE]
    assert original.endswith(b"data: [DONE]\n\n")


async def test_a_replay_resumes_after_last_event_id_or_from(client):
    resp = await client.post(INVOKE("ticker"), json={"count": 4, "delay_ms": 1}, headers=SSE)
    original = await resp.read()
    inv_id = resp.headers["X-Invocation-Id"]
    tail = original[original.index(b"id: 3\n"):]
    by_header = await client.get(EVENTS(inv_id), headers={"Last-Event-ID": "2"})
    by_query = await client.get(EVENTS(inv_id) + "?from=2")
    assert _without_pings(await by_header.read()) == tail == _without_pings(await by_query.read())
    for after in ("5", "6"):  # after the result (and one past it, the end's own element): only [DONE]
        last = await client.get(EVENTS(inv_id), headers={"Last-Event-ID": after})
        assert _without_pings(await last.read()) == b"data: [DONE]\n\n"
    beyond = await client.get(EVENTS(inv_id), headers={"Last-Event-ID": "9"})
    assert beyond.status == 400
    bad = await client.get(EVENTS(inv_id) + "?from=x")
    assert bad.status == 400


async def test_the_kept_output_is_the_tenants_named_stream(client):
    resp = await client.post(INVOKE("ticker"), json={"count": 3, "delay_ms": 1}, headers=SSE)
    await resp.read()
    inv_id = resp.headers["X-Invocation-Id"]
    sub = await client.get(f"/serverless/v1/streams/invocations/{inv_id}?from_id=0")
    events = [ev async for ev in iter_sse(sub)]
    assert [(e["id"], e["data"]) for e in events] == [("1", '{"tick":1}'), ("2", '{"tick":2}'), ("3", '{"tick":3}'),
                                                ("4", '"done"'), ("5", "[DONE]")]


async def test_an_event_the_stream_refuses_breaks_the_kept_output_never_the_answer(make_client, deploy_dir):
    """`{"tick":10}` is one byte over streams.maxElementSize: the live answer has every event, and a
    reader of the kept output is told it is not whole (whichever publish, the first or a later one,
    met the refusal)."""
    client = await make_client(_config(deploy_dir, **{"streams.maxElementSize": 10}))
    resp = await client.post(INVOKE("ticker"), json={"count": 10, "delay_ms": 1}, headers=SSE)
    events = [ev async for ev in iter_sse(resp)]
    assert [ev["data"] for ev in events[:10]] == [json.dumps({"tick": i}, separators=(",", ":")) for i in range(1, 11)]
    again = await client.get(EVENTS(resp.headers["X-Invocation-Id"]))
    body = await again.read()
    assert again.status == 200 and b"is not kept whole" in body and b"streams.maxElementSize" in body, body


async def test_a_window_that_no_longer_reaches_back_says_so(make_client, deploy_dir):
    client = await make_client(_config(deploy_dir, **{"streams.invocationRetentionBytes": 30}))
    resp = await client.post(INVOKE("ticker"), json={"count": 6, "delay_ms": 1}, headers=SSE)
    await resp.read()
    again = await client.get(EVENTS(resp.headers["X-Invocation-Id"]))
    [error] = [ev async for ev in iter_sse(again)]
    assert error["event"] == "error"
    body = json.loads(error["data"])
    assert body["lost_from_id"] == 1 and body["lost_to_id"] >= 1 and "no longer kept" in body["message"]


async def test_retention_zero_keeps_nothing_and_answers_as_before(make_client, deploy_dir):
    client = await make_client(_config(deploy_dir, **{"streams.invocationRetentionSeconds": 0}))
    resp = await client.post(INVOKE("ticker"), json={"count": 2, "delay_ms": 1}, headers=SSE)
    assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    assert (await client.get(EVENTS(resp.headers["X-Invocation-Id"]))).status == 404
    assert (await (await client.get("/serverless/v1/streams")).json())["streams"] == []


async def test_json_calls_are_not_kept(client):
    resp = await client.post(INVOKE("ticker"), json={"count": 1})
    assert resp.status == 200
    gone = await client.get(EVENTS(resp.headers["X-Invocation-Id"]))
    assert gone.status == 404


# -- a drop ----------------------------------------------------------------------------------

@pytest.mark.parametrize("door", DOORS)
async def test_with_continue_a_dropped_client_resumes_every_later_event_exactly_once(client, door):
    s = _state(client, "kept", f"resume-{door}")
    s["release"] = 3
    resp = await client.post(INVOKE("kept"), json={"marker": f"resume-{door}", "count": 8},
                             headers={**SSE, **DOORS[door]})
    inv_id = resp.headers["X-Invocation-Id"]
    seen = []
    async for ev in iter_sse(resp):
        seen.append(ev)
        if len(seen) == 3:
            break
    assert [e["id"] for e in seen] == ["1", "2", "3"] and s["written"] == 3  # live: the producer waits on us
    resp.close()  # the client drops mid-stream
    s["release"] = 5  # it writes on with nobody connected
    await _until(lambda: s["written"] == 5, "the handler wrote on after the drop")
    again = await client.get(EVENTS(inv_id), headers={"Last-Event-ID": "3"})
    rest = []
    async for ev in iter_sse(again):
        rest.append(ev)
        if ev["id"] == "5":
            assert s["written"] == 5 and not s["log"]  # the replayed ones, and the producer is still running
            s["release"] = 8
    assert [(e["id"], e["data"]) for e in rest] == [(str(i), json.dumps({"i": i}, separators=(",", ":")))
                                              for i in range(4, 9)] + [("9", '{"done":8}'), (None, "[DONE]")]
    assert s["log"] == ["finished"]  # it never noticed


async def test_with_continue_the_function_timeout_still_bounds_it(client):
    s = _state(client, "short", "timeout")
    s["release"] = 1
    resp = await client.post(INVOKE("short"), json={"marker": "timeout", "count": 3}, headers=SSE)
    inv_id = resp.headers["X-Invocation-Id"]
    async for _ev in iter_sse(resp):
        break
    resp.close()
    again = await client.get(EVENTS(inv_id), headers={"Last-Event-ID": "1"})
    events = [ev async for ev in iter_sse(again)]
    assert [e["data"] for e in events][-1] == "[DONE]"
    assert "timed out" in json.loads(events[-2]["data"])["message"]
    assert s["log"] == ["cancelled"]


async def test_by_default_a_drop_still_cancels(client):
    s = _state(client, "gated", "drop")
    s["release"] = 2
    resp = await client.post(INVOKE("gated"), json={"marker": "drop", "count": 5}, headers=SSE)
    inv_id = resp.headers["X-Invocation-Id"]
    seen = []
    async for ev in iter_sse(resp):
        seen.append(ev)
        if len(seen) == 2:
            break
    resp.close()
    await _until(lambda: s["log"] == ["cancelled"], "the handler was cancelled")
    again = await client.get(EVENTS(inv_id))
    events = [ev async for ev in iter_sse(again)]
    assert [e["id"] for e in events[:2]] == ["1", "2"] and events[-1]["data"] == "[DONE]"
    assert "client disconnected" in json.loads(events[-2]["data"])["message"]


# -- cancel by id ----------------------------------------------------------------------------

async def test_cancel_by_id_ends_the_stream_with_the_cancel_error(client):
    s = _state(client, "kept", "cancel")
    s["release"] = 2
    resp = await client.post(INVOKE("kept"), json={"marker": "cancel", "count": 5}, headers=SSE)
    inv_id = resp.headers["X-Invocation-Id"]
    events = []
    async for ev in iter_sse(resp):
        events.append(ev)
        if len(events) == 2:
            cancelled = await client.post(CANCEL(inv_id))
            assert cancelled.status == 200 and (await cancelled.json())["status"] == "cancelled"
    assert events[-1]["data"] == "[DONE]"
    assert json.loads(events[-2]["data"])["code"] == 200410 and events[-2]["id"] == "3"
    assert s["log"] == ["cancelled"]
    again = await client.post(CANCEL(inv_id))
    assert again.status == 409
    unknown = await client.post(CANCEL("x" * 22))
    assert unknown.status == 404


# -- tenants ---------------------------------------------------------------------------------

async def test_only_the_invoking_tenant_or_an_admin_reads_or_cancels(make_client, deploy_dir):
    client = await make_client(_config(deploy_dir, **{"auth.tokens": TOKENS}))
    a, b, admin = ({"Authorization": f"Bearer {t}"} for t in ("user-a", "user-b", "root"))
    resp = await client.post(INVOKE("ticker"), json={"count": 2, "delay_ms": 1}, headers={**SSE, **a})
    original = await resp.read()
    inv_id = resp.headers["X-Invocation-Id"]
    unknown = await client.get(EVENTS("y" * 22), headers=b)
    for answer in (await client.get(EVENTS(inv_id), headers=b), await client.post(CANCEL(inv_id), headers=b)):
        assert answer.status == 404
        body = await answer.json()
        expected = await unknown.json()
        assert {**body, "trace_id": None} == {**expected, "trace_id": None}
    assert _without_pings(await (await client.get(EVENTS(inv_id), headers=a)).read()) == original
    assert _without_pings(await (await client.get(EVENTS(inv_id), headers=admin)).read()) == original
    assert (await client.get(EVENTS(inv_id))).status == 401


async def test_at_most_count_ended_invocations_are_kept_the_oldest_go_first(make_client, deploy_dir):
    client = await make_client(_config(deploy_dir, **{"streams.invocationRetentionCount": 2}))
    ids = []
    for _ in range(3):
        resp = await client.post(INVOKE("ticker"), json={"count": 1, "delay_ms": 1}, headers=SSE)
        await resp.read()
        ids.append(resp.headers["X-Invocation-Id"])
    assert [(await client.get(EVENTS(i))).status for i in ids] == [404, 200, 200]
    async def names():
        return sorted(s["name"] for s in (await (await client.get("/serverless/v1/streams")).json())["streams"])
    kept = sorted(f"invocations/{i}" for i in ids[1:])
    for _ in range(400):  # its stream goes too, with the next reaping (a batch a moment later)
        if await names() == kept:
            break
        await asyncio.sleep(0.005)
    assert await names() == kept


async def test_one_tenants_flood_of_invocations_does_not_evict_anothers_output(make_client, deploy_dir):
    """Past invocationRetentionCount the oldest record of the tenant keeping the most goes: tenant
    acme's one kept invocation outlives the default tenant's five."""
    deploy = deploy_dir(fn("ticker", "testfns.sync_ticker"), fn("ticker-b", "testfns.sync_ticker", tenant="acme"))
    client = await make_client(test_config(deploy, **{"frontend.args.enableEvent": True, "auth.tokens": TOKENS,
                                                      "streams.invocationRetentionCount": 3}))
    a, b = ({"Authorization": f"Bearer {t}"} for t in ("user-a", "user-b"))
    resp = await client.post(INVOKE("ticker-b"), json={"count": 1, "delay_ms": 1}, headers={**SSE, **b})
    original = await resp.read()
    kept_b = resp.headers["X-Invocation-Id"]
    ids_a = []
    for _ in range(5):
        resp = await client.post(INVOKE("ticker"), json={"count": 1, "delay_ms": 1}, headers={**SSE, **a})
        await resp.read()
        ids_a.append(resp.headers["X-Invocation-Id"])
    assert _without_pings(await (await client.get(EVENTS(kept_b), headers=b)).read()) == _without_pings(original)
    assert [(await client.get(EVENTS(i), headers=a)).status for i in ids_a] == [404, 404, 404, 200, 200]


async def test_with_continue_a_thread_handler_is_not_held_by_the_drop(make_client, deploy_dir):
    """A `def` handler blocks in write() while its buffer is full: after the drop the kept output
    drains it, so it writes on to its end (a buffer of 2 events; 30 to write)."""
    deploy = deploy_dir(fn("kept-sync", "testfns.sync_ticker", onDisconnect="continue", timeout=60))
    client = await make_client(test_config(deploy, **{"frontend.args.enableEvent": True,
                                                      "frontend.args.streamBufferEvents": 2}))
    resp = await client.post(INVOKE("kept-sync"), json={"count": 30, "delay_ms": 1}, headers=SSE)
    inv_id = resp.headers["X-Invocation-Id"]
    async for _ev in iter_sse(resp):
        break
    resp.close()
    again = await client.get(EVENTS(inv_id), headers={"Last-Event-ID": "1"})
    events = [ev async for ev in iter_sse(again)]
    assert [e["id"] for e in events] == [str(i) for i in range(2, 32)] + [None]
    assert events[-2]["data"] == '"done"' and events[-1]["data"] == "[DONE]"


async def test_another_frontends_answer_resumes_after_an_id_not_yet_published(client):
    """Cluster mode: the answering frontend publishes its events off the answer's path, so its
    client may hold an id the shared stream has not got yet. A resume after that id through
    another frontend reads on (only the later events, then the end) rather than refusing it."""
    from frontend.keys import BROKER, OUTPUTS
    from runtime.durable import STREAM_PREFIX
    from runtime.streams.tenancy import qualify
    from tests.support.waiting import eventually

    outputs, broker = client.server.app[OUTPUTS], client.server.app[BROKER]
    outputs.shared = True  # as in cluster mode: another frontend's answers are in the same broker
    inv_id = "r" * 22
    key = qualify("default", STREAM_PREFIX + inv_id)
    await broker.configure(key, outputs._options)
    await broker.publish(key, [b'{"i":1}'])  # the answer sent 1 and 2; only 1 is published yet
    answer = asyncio.ensure_future(client.get(EVENTS(inv_id), headers={"Last-Event-ID": "2"}))

    async def reading() -> bool:
        return answer.done() or (await broker.stats(key)).consumers == 1

    await eventually(reading, "the resume reading the stream (or answered)")
    await broker.publish(key, [b'{"i":2}', b'{"i":3}', b'"result"', b"[DONE]"])
    resp = await answer
    assert resp.status == 200, await resp.text()
    events = [(e.get("id"), e["data"]) async for e in iter_sse(resp)]
    assert events == [("3", '{"i":3}'), ("4", '"result"'), (None, "[DONE]")]
    late = await client.get(EVENTS(inv_id), headers={"Last-Event-ID": "9"})  # past its end: the end, not a wait
    assert _without_pings(await late.read()) == b"data: [DONE]\n\n"
