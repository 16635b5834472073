"""GET /metrics: Prometheus text (parsed with prometheus_client's own parser) of invocations,
streams and pools; auth; off switch."""
import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import fn, read_events, test_config

DEV, USER = "dev-token", "user-token"


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
async def metered(make_client, deploy_dir):
    async def factory(**overrides):
        deploy = deploy_dir(fn("record", "observed_fns.record"), fn("fails", "observed_fns.fails"),
                            fn("slow", "observed_fns.slow", timeout=0.3),
                            fn("one", "observed_fns.slow", concurrency=1),
                            fn("ticker", "testfns.sync_ticker"))
        return await make_client(config=test_config(deploy, **overrides))
    return factory


async def _scrape(client, **headers) -> dict:
    resp = await client.get("/metrics", headers=headers)
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/plain; version=")
    return _samples(await resp.text())


async def test_invocations_by_function_and_outcome(metered):
    client = await metered()
    url = "/serverless/v1/functions/{}/invocations".format
    for _ in range(3):
        assert (await client.post(url("record"), json={})).status == 200
    assert (await client.post(url("fails"), json={})).status == 500
    assert (await client.post(url("slow"), json={"seconds": 5})).status == 504
    hold = asyncio.ensure_future(client.post(url("one"), json={"seconds": 1}))
    await asyncio.sleep(0.2)
    assert (await client.post(url("one"), json={})).status == 429
    during = await _scrape(client)
    assert _value(during, "fnstream_inflight", function="one") == 1
    assert (await hold).status == 200
    resp = await client.post(url("ticker"), json={"count": 3, "delay": 0.01}, headers={"Accept": "text/event-stream"})
    events = await read_events(resp)
    s = await _scrape(client)
    assert _value(s, "fnstream_invocations_total", function="record", outcome="ok", code="0") == 3
    assert _value(s, "fnstream_invocations_total", function="fails", outcome="error", code="4001") == 1
    assert _value(s, "fnstream_invocations_total", function="slow", outcome="timeout", code="4010") == 1
    assert _value(s, "fnstream_invocations_total", function="one", outcome="throttled", code="200429") == 1
    assert _value(s, "fnstream_timeouts_total", function="slow") == 1
    assert _value(s, "fnstream_throttled_total", function="one") == 1
    assert _value(s, "fnstream_invocation_duration_seconds_count", function="record") == 3
    assert _value(s, "fnstream_invocation_duration_seconds_bucket", function="slow", le="0.1") == 0
    assert _value(s, "fnstream_invocation_duration_seconds_bucket", function="slow", le="+Inf") == 1
    assert _value(s, "fnstream_stream_events_total", function="ticker") == 3
    assert _value(s, "fnstream_stream_bytes_total", function="ticker") == sum(
        len(f"id: {i}\ndata: {e['data']}\n\n") for i, (_, e) in enumerate(events, 1) if e["data"] != "[DONE]") \
        + len("data: [DONE]\n\n")
    assert _value(s, "fnstream_time_to_first_event_seconds_count", function="ticker") == 1
    assert _value(s, "fnstream_inflight", function="one") == 0


async def test_disconnects_and_heartbeats(metered):
    client = await metered(**{"frontend.args.heartbeatSeconds": 0.05})
    resp = await client.post("/serverless/v1/functions/slow/invocations", json={"seconds": 0.25},
                             headers={"Accept": "text/event-stream"})
    await resp.read()
    resp = await client.post("/serverless/v1/functions/one/invocations", json={"seconds": 5},
                             headers={"Accept": "text/event-stream"})
    await asyncio.sleep(0.1)
    resp.close()
    for _ in range(100):
        s = await _scrape(client)
        if _value(s, "fnstream_client_disconnects_total", function="one"):
            break
        await asyncio.sleep(0.05)
    assert _value(s, "fnstream_client_disconnects_total", function="one") == 1
    assert _value(s, "fnstream_invocations_total", function="one", outcome="disconnected", code="disconnected") == 1
    assert _value(s, "fnstream_heartbeats_total", function="slow") >= 2


async def test_named_stream_metrics_are_read_from_the_broker(metered):
    client = await metered()
    sub = await client.get("/serverless/v1/streams/m1", headers={"X-Expect-Num": "2"})
    await asyncio.sleep(0.1)
    assert (await client.post("/serverless/v1/streams/m1", json=["a", "bb"])).status == 200
    await sub.read()
    s = await _scrape(client)
    assert _value(s, "fnstream_stream_produced_total", tenant="default", stream="m1") == 2
    assert _value(s, "fnstream_stream_delivered_total", tenant="default", stream="m1") == 2
    assert _value(s, "fnstream_stream_dropped_total", tenant="default", stream="m1") == 0
    assert ("fnstream_stream_retained_bytes", (("stream", "m1"), ("tenant", "default"))) in s
    assert ("fnstream_stream_subscribers", (("stream", "m1"), ("tenant", "default"))) in s
    assert _value(s, "fnstream_streams") >= 1


async def test_metrics_need_the_developer_role_unless_public(metered):
    tokens = [{"token": DEV, "role": "developer"}, {"token": USER, "role": "user"}]
    client = await metered(**{"auth.tokens": tokens})
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/metrics", headers={"Authorization": f"Bearer {USER}"})).status == 403
    await _scrape(client, Authorization=f"Bearer {DEV}")
    public = await metered(**{"auth.tokens": tokens, "metrics.public": True})
    await _scrape(public)
    assert (await public.get("/admin/v1/functions")).status == 401  # only /metrics became public


async def test_metrics_can_be_switched_off(metered):
    client = await metered(**{"metrics.enabled": False})
    assert (await client.get("/metrics")).status == 404
    assert (await client.post("/serverless/v1/functions/record/invocations", json={})).status == 200


async def test_worker_pool_metrics(make_client):
    from tests.support.servers import PROCESS_FUNCTIONS

    client = await make_client(**{"runtime.codeRoots": [str(PROCESS_FUNCTIONS)], "runtime.deployDir": None})
    manifest = {"name": "proc-pid", "handler": "proc.pid", "codePath": ".", "executor": "process", "instances": 2}
    assert (await client.post("/admin/v1/functions", json=manifest)).status == 201
    assert (await client.post("/serverless/v1/functions/proc-pid/invocations", json={})).status == 200
    s = await _scrape(client)
    assert _value(s, "fnstream_pool_instances", function="proc-pid") == 2
    assert _value(s, "fnstream_pool_busy", function="proc-pid") == 0
    assert ("fnstream_pool_restarts_total", (("function", "proc-pid"),)) in s
    assert _value(s, "fnstream_invocations_total", function="proc-pid", outcome="ok", code="0") == 1
