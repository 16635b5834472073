"""Invoke spine: JSON results, live SSE, errors, over the in-process client — each test through
both doors (frontend/front_door.py): the fast lane, and the app path (router, middlewares, the
invoke route) that every browser's request takes."""
import asyncio
import gc
import json
import time

import pytest

from frontend.app import build_app
from tests.support.servers import (
    HELLO_BYTES,
    FnstreamTestServer,
    assert_live,
    fn,
    make_config,
    read_events,
    test_config,
)

SSE = {"Accept": "text/event-stream"}


@pytest.fixture(params=["fast lane", "app path"])
def make_client(request, aiohttp_client):
    """The suite's `make_client` (an app served as `fnstream serve` serves it), once with the
    front door's fast lane and once without (`fast_lane=False`: every request through the app)."""
    async def factory(config=None, **overrides):
        app = build_app(config or make_config(**overrides))
        return await aiohttp_client(FnstreamTestServer(app, fast_lane=request.param == "fast lane"))

    return factory


@pytest.fixture
async def client(make_client):
    return await make_client()
async def test_hello_three_events_byte_for_byte(client):
    resp = await client.post("/serverless/v1/functions/hello/invocations", headers=SSE)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["Cache-Control"] == "no-cache"
    assert resp.headers["X-Accel-Buffering"] == "no"
    assert "Content-Encoding" not in resp.headers
    assert await resp.read() == HELLO_BYTES


async def test_a_finished_stream_leaves_no_cyclic_garbage(client):
    """A server's objects of a finished stream go as its connection does, freed by their counts:
    a stream that held its request (which holds the stream, for metrics) made every finished
    connection cyclic garbage, ~33 objects that the collector's full collections walked."""
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            resp = await client.post("/serverless/v1/functions/hello/invocations", headers=SSE)
            assert await resp.read() == HELLO_BYTES
        await client.close()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = {type(o).__name__ for o in gc.garbage} & {"EventStream", "Invocation", "Request", "OutputChannel"}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == set()


async def test_hello_plain_json(client):
    resp = await client.post("/serverless/v1/functions/hello/invocations", data=b"")
    assert resp.status == 200
    assert await resp.read() == b'"ok"'
    assert resp.headers["X-Inner-Code"] == "0"
    assert int(resp.headers["X-Billing-Duration"]) >= 0
    assert len(resp.headers["X-Trace-Id"]) >= 16


async def test_echo_and_trace_id_passthrough(client):
    body = {"a": [1, 2, {"b": "ü"}]}
    resp = await client.post("/serverless/v1/functions/echo/invocations", json=body,
                             headers={"X-Trace-Id": "trace-123"})
    assert resp.status == 200
    assert await resp.json() == body
    assert resp.headers["X-Trace-Id"] == "trace-123"


async def test_urn_and_short_route(client):
    urn = "sn:cn:yrk:default:function:0@default@echo:latest"
    resp = await client.post(f"/serverless/v1/functions/{urn}/invocations", json={"x": 1})
    assert await resp.json() == {"x": 1}
    resp = await client.post("/invocations/default/default/echo/", json={"y": 2})
    assert await resp.json() == {"y": 2}
    resp = await client.post("/invocations/default/default/echo:latest/", json={"y": 3})
    assert await resp.json() == {"y": 3}
    resp = await client.post("/invocations/other/default/echo/", json={})
    assert resp.status == 404


async def test_ticker_events_arrive_while_handler_runs(client):
    """The seed bug: 'it returns all the data at once'. The first event must come early."""
    resp = await client.post("/serverless/v1/functions/ticker/invocations", headers=SSE,
                             json={"count": 5, "delay_ms": 200})
    events = await read_events(resp)
    data = [json.loads(e["data"]) for _, e in events if e["data"] != "[DONE]"]
    assert data[:5] == [{"tick": i, "of": 5} for i in range(1, 6)]
    assert data[5] == {"ticks": 5}
    assert events[-1][1]["data"] == "[DONE]"
    assert_live([t for t, _ in events[:5]], 0.8)
    # and each tick arrives apart from the previous one, not in one burst
    gaps = [events[i + 1][0] - events[i][0] for i in range(4)]
    assert all(g > 0.1 for g in gaps), gaps


async def test_sync_thread_handler_streams_live(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("sticker", "testfns.sync_ticker"))))
    resp = await client.post("/serverless/v1/functions/sticker/invocations", headers=SSE,
                             json={"count": 5, "delay_ms": 200})
    events = await read_events(resp)
    assert [e["data"] for _, e in events] == [*(json.dumps({"tick": i}, separators=(",", ":")) for i in range(1, 6)),
                                              '"done"', "[DONE]"]
    assert [e["id"] for _, e in events[:6]] == ["1", "2", "3", "4", "5", "6"]
    assert_live([t for t, _ in events[:5]], 0.8)


async def test_generators_stream_or_aggregate(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("gen", "testfns.gen"), fn("agen", "testfns.agen"))))
    resp = await client.post("/serverless/v1/functions/gen/invocations", json={"n": 3})
    assert await resp.json() == [{"i": 0}, {"i": 1}, {"i": 2}]
    resp = await client.post("/serverless/v1/functions/agen/invocations", json={"n": 2})
    assert await resp.json() == ["item-0", "item-1"]
    resp = await client.post("/serverless/v1/functions/gen/invocations", json={"n": 2}, headers=SSE)
    assert await resp.read() == b'id: 1\ndata: {"i":0}\n\nid: 2\ndata: {"i":1}\n\ndata: [DONE]\n\n'
    resp = await client.post("/serverless/v1/functions/agen/invocations", json={"n": 4, "delay": 0.2}, headers=SSE)
    events = await read_events(resp)
    assert [e["data"] for _, e in events] == ["item-0", "item-1", "item-2", "item-3", "[DONE]"]
    assert_live([t for t, _ in events[:4]], 0.6)


async def test_multiline_payload_split_into_data_lines(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("ml", "testfns.multiline"))))
    resp = await client.post("/serverless/v1/functions/ml/invocations", headers=SSE)
    assert await resp.read() == b"id: 1\ndata: line one\ndata: line two\ndata: line three\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize("accept,expect", [
    ("text/event-stream", "sse"),
    ("text/event-stream; charset=utf-8", "sse"),
    ("application/json, text/event-stream;q=0.5", "json"),
    ("text/event-stream;q=0.9, application/json;q=0.1", "sse"),
    ("*/*", "json"),
    (None, "json"),
    ("text/event-stream;q=0", "json"),
    ("text/html", "json"),  # merely lists another type: lenient
])
async def test_accept_negotiation(client, accept, expect):
    headers = {"Accept": accept} if accept else {}
    resp = await client.post("/serverless/v1/functions/hello/invocations", headers=headers)
    assert resp.status == 200
    is_sse = resp.headers["Content-Type"].startswith("text/event-stream")
    assert is_sse == (expect == "sse")


async def test_sse_disabled(make_client):
    client = await make_client(**{"frontend.args.enableEvent": False})
    resp = await client.post("/serverless/v1/functions/hello/invocations", headers=SSE)
    assert resp.status == 406
    assert "frontend.args.enableEvent" in (await resp.json())["message"]
    resp = await client.post("/serverless/v1/functions/hello/invocations",
                             headers={"Accept": "text/event-stream, application/json;q=0.5"})
    assert resp.status == 200 and await resp.read() == b'"ok"'


@pytest.mark.parametrize("accept", ["application/json;q=0", "*/*;q=0", "application/*;q=0, text/html"])
async def test_json_refused_and_no_sse_is_406(client, accept):
    resp = await client.post("/serverless/v1/functions/echo/invocations", headers={"Accept": accept}, json={})
    assert resp.status == 406 and "refuses application/json" in (await resp.json())["message"]


def test_enable_event_defaults_to_false_when_absent(tmp_path):
    from runtime.config import load_config
    path = tmp_path / "c.yaml"
    path.write_text("frontend:\n  port: 1234\n")
    assert load_config(path).frontend.args.enableEvent is False


# -- errors -------------------------------------------------------------------------------------

async def test_unknown_function_404(client):
    resp = await client.post("/serverless/v1/functions/nope/invocations")
    assert resp.status == 404
    body = await resp.json()
    assert body["code"] == 150424 and "nope" in body["message"] and body["trace_id"]
    assert resp.headers["X-Inner-Code"] == "150424"


@pytest.mark.parametrize("body", [b"{bad", b"\xff\xfe", b"not json at all"])
async def test_malformed_json_400(client, body):
    resp = await client.post("/serverless/v1/functions/echo/invocations", data=body)
    assert resp.status == 400
    data = await resp.json()
    assert data["code"] == 200400 and "JSON" in data["message"]


async def test_empty_body_is_empty_object(client):
    resp = await client.post("/serverless/v1/functions/echo/invocations", data=b"")
    assert await resp.json() == {}


async def test_oversized_body_413(make_client):
    client = await make_client(**{"frontend.args.maxRequestBodySize": 0.001})  # ~1 KB
    resp = await client.post("/serverless/v1/functions/echo/invocations", data=json.dumps({"x": "a" * 5000}))
    assert resp.status == 413
    data = await resp.json()
    assert data["code"] == 4140 and "maxRequestBodySize" in data["message"]
    # the server is fine afterwards
    resp = await client.post("/serverless/v1/functions/echo/invocations", json={"ok": 1})
    assert await resp.json() == {"ok": 1}


async def test_handler_raises_before_any_event(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("bad", "testfns.raise_early"))))
    resp = await client.post("/serverless/v1/functions/bad/invocations")
    assert resp.status == 500
    body = await resp.json()
    assert body["code"] == 4001 and "ValueError" in body["message"] and "no widgets" in body["message"]
    resp = await client.post("/serverless/v1/functions/bad/invocations", headers=SSE)
    assert resp.status == 500
    assert resp.headers["X-Inner-Code"] == "4001"
    events = [e for _, e in await read_events(resp)]
    assert json.loads(events[0]["data"])["code"] == 4001
    assert events[1]["data"] == "[DONE]"


async def test_handler_raises_mid_stream(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("mid", "testfns.raise_mid"))))
    resp = await client.post("/serverless/v1/functions/mid/invocations", headers=SSE)
    assert resp.status == 200
    events = [e for _, e in await read_events(resp)]
    assert [e["data"] for e in events[:2]] == ["first", "second"]
    err = json.loads(events[2]["data"])
    assert err["code"] == 4001 and "RuntimeError" in err["message"] and "boom" in err["message"]
    assert events[3]["data"] == "[DONE]"


async def test_a_base_exception_of_the_handlers_own_is_a_handler_error(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("bx", "testfns.raises_base_exception"))))
    for _ in range(2):   # and the function's concurrency slot came back
        resp = await client.post("/serverless/v1/functions/bx/invocations")
        assert resp.status == 500
        assert "_OwnBaseException: not an Exception" in (await resp.json())["message"]


async def test_sys_exit_is_a_handler_error(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("ex", "testfns.exits"))))
    resp = await client.post("/serverless/v1/functions/ex/invocations")
    assert resp.status == 500
    assert "sys.exit(3)" in (await resp.json())["message"]
    resp = await client.get("/healthz")
    assert resp.status == 200


async def test_result_not_serializable_and_none(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("ns", "testfns.not_serializable"),
                                                      fn("none", "testfns.returns_none"))))
    resp = await client.post("/serverless/v1/functions/ns/invocations")
    assert resp.status == 500 and (await resp.json())["code"] == 4007
    resp = await client.post("/serverless/v1/functions/none/invocations", headers=SSE)
    assert await resp.read() == b"id: 1\ndata: only\n\ndata: [DONE]\n\n"
    resp = await client.post("/serverless/v1/functions/none/invocations")
    assert await resp.read() == b"null"


async def test_write_too_large(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("big", "testfns.big_write")),
                                           **{"frontend.args.maxWriteSize": 1000}))
    resp = await client.post("/serverless/v1/functions/big/invocations", headers=SSE, json={"size": 1001})
    events = [e for _, e in await read_events(resp)]
    err = json.loads(events[0]["data"])
    assert "exceeds the limit of 1000 bytes" in err["message"]
    resp = await client.post("/serverless/v1/functions/big/invocations", headers=SSE, json={"size": 1000})
    assert resp.status == 200 and [e["data"] for _, e in await read_events(resp)][-2:] == ['"ok"', "[DONE]"]


async def test_context_methods(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(
        fn("ctx", "testfns.context_info", environment={"GREETING": "hi"}, version="v2", timeout=30))))
    resp = await client.post("/serverless/v1/functions/ctx:v2/invocations", headers={"X-Trace-Id": "t-1"})
    info = await resp.json()
    assert info["request_id"] == info["trace_id"] == "t-1"
    assert info["invoke_id"] and info["name"] == "ctx" and info["version"] == "v2"
    assert info["tenant"] == "default" and info["greeting"] == "hi" and info["missing"] == "fallback"
    assert 25_000 < info["remaining_ms"] <= 30_000  # milliseconds, not seconds
    assert 0 <= info["running_s"] < 5
    assert info["logger"] == "fnstream.function.ctx"


async def test_initializer_runs_once_and_failure_is_4201(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(
        fn("inited", "testfns.counted", initializer="testfns.init_ok"),
        fn("initbad", "testfns.counted", initializer="testfns.init_fail"))))
    results = await asyncio.gather(*(client.post("/serverless/v1/functions/inited/invocations") for _ in range(5)))
    assert [await r.json() for r in results] == [{"init_calls": 1}] * 5
    for _ in range(2):
        resp = await client.post("/serverless/v1/functions/initbad/invocations")
        assert resp.status == 500
        body = await resp.json()
        assert body["code"] == 4201 and "cannot reach the database" in body["message"]


async def test_raw_stream_is_verbatim_and_live(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("raw", "testfns.self_framed", rawStream=True))))
    start = time.monotonic()
    resp = await client.post("/serverless/v1/functions/raw/invocations", headers=SSE,
                             json={"count": 4, "delay_ms": 200})
    arrivals, body = [], b""
    async for chunk in resp.content.iter_any():
        arrivals.append(time.monotonic() - start)
        body += chunk
    assert body == b"".join(b'data: {"n": %d}\n\n' % i for i in range(4)) + b"data: [DONE]\n\n"  # no framing of ours
    assert_live(arrivals, 0.6)


async def test_msgpack_subscription_is_live(make_client, deploy_dir):
    """Named-stream elements reach an `Accept: application/x-msgpack` subscriber as produced."""
    import msgpack
    client = await make_client()
    sub = await client.get("/serverless/v1/streams/mp-live", headers={"Accept": "application/x-msgpack"})
    assert sub.status == 200
    start = time.monotonic()
    producing = asyncio.ensure_future(client.post(
        "/serverless/v1/functions/stream-producer/invocations",
        json={"stream": "mp-live", "count": 4, "delay_ms": 200}))
    unpacker, items, arrivals = msgpack.Unpacker(raw=False), [], []
    async for chunk in sub.content.iter_any():
        unpacker.feed(chunk)
        for obj in unpacker:
            if obj is not None:  # nil objects are heartbeats
                items.append(obj)
                arrivals.append(time.monotonic() - start)
    assert (await producing).status == 200
    assert [o["id"] for o in items] == [1, 2, 3, 4, 5]
    assert_live(arrivals, 0.6)
