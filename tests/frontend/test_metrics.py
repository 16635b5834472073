"""GET /metrics: Prometheus text (parsed with prometheus_client's own parser) of invocations,
streams and pools; auth; off switch."""
import asyncio
import json

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


def _fn(samples, name, function, tenant="default", **labels) -> float:
    """A per-function sample (every one carries its tenant)."""
    return _value(samples, name, tenant=tenant, function=function, **labels)


@pytest.fixture
async def metered(make_client, deploy_dir):
    async def factory(**overrides):
        deploy = deploy_dir(fn("record", "observed_fns.record"), fn("fails", "observed_fns.fails"),
                            fn("slow", "observed_fns.slow", timeout=0.3),
                            fn("one", "observed_fns.slow", concurrency=1),
                            fn("ticker", "testfns.sync_ticker"),
                            fn("job-echo", "job_fns.echo"), fn("job-raises", "job_fns.raises"),
                            fn("job-sleeper", "job_fns.sleeper", concurrency=1))
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
    assert _fn(during, "fnstream_inflight", "one") == 1
    assert (await hold).status == 200
    resp = await client.post(url("ticker"), json={"count": 3, "delay": 0.01}, headers={"Accept": "text/event-stream"})
    events = await read_events(resp)
    s = await _scrape(client)
    assert _fn(s, "fnstream_invocations_total", "record", outcome="ok", code="0") == 3
    assert _fn(s, "fnstream_invocations_total", "fails", outcome="error", code="4001") == 1
    assert _fn(s, "fnstream_invocations_total", "slow", outcome="timeout", code="4010") == 1
    assert _fn(s, "fnstream_invocations_total", "one", outcome="throttled", code="200429") == 1
    assert _fn(s, "fnstream_timeouts_total", "slow") == 1
    assert _fn(s, "fnstream_throttled_total", "one") == 1
    assert _fn(s, "fnstream_invocation_duration_seconds_count", "record") == 3
    assert _fn(s, "fnstream_invocation_duration_seconds_bucket", "slow", le="0.1") == 0
    assert _fn(s, "fnstream_invocation_duration_seconds_bucket", "slow", le="+Inf") == 1
    assert _fn(s, "fnstream_stream_events_total", "ticker") == 3
    assert _fn(s, "fnstream_stream_bytes_total", "ticker") == sum(
        len(f"id: {i}\ndata: {e['data']}\n\n") for i, (_, e) in enumerate(events, 1) if e["data"] != "[DONE]") \
        + len("data: [DONE]\n\n")
    assert _fn(s, "fnstream_time_to_first_event_seconds_count", "ticker") == 1
    assert _fn(s, "fnstream_inflight", "one") == 0


async def test_a_stream_aborted_by_a_shutdown_after_its_first_event_counts_as_aborted(metered):
    """The drain aborts what still runs (503 / 200503): a stream that had sent events ends with the
    error event, and counts as that error, not as a success (its task was cancelled, its status 200)."""
    from frontend.keys import EXECUTOR
    from runtime.errors import ServiceUnavailableError

    client = await metered()
    resp = await client.post("/serverless/v1/functions/ticker/invocations", json={"count": 50, "delay_ms": 20},
                             headers={"Accept": "text/event-stream"})
    assert b"tick" in await resp.content.readuntil(b"\n\n")
    (inv,) = client.server.app[EXECUTOR].active
    inv.abort(ServiceUnavailableError("the server is shutting down"))
    assert b"200503" in await resp.read()
    s = await _scrape(client)
    assert _fn(s, "fnstream_invocations_total", "ticker", outcome="error", code="200503") == 1
    assert _fn(s, "fnstream_invocations_total", "ticker", outcome="ok", code="0") == 0


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
        if _fn(s, "fnstream_client_disconnects_total", "one"):
            break
        await asyncio.sleep(0.05)
    assert _fn(s, "fnstream_client_disconnects_total", "one") == 1
    assert _fn(s, "fnstream_invocations_total", "one", outcome="disconnected", code="disconnected") == 1
    assert _fn(s, "fnstream_heartbeats_total", "slow") >= 2


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
    assert _value(s, "fnstream_streams", tenant="default") >= 1


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
    assert _fn(s, "fnstream_pool_instances", "proc-pid") == 2
    assert _fn(s, "fnstream_pool_busy", "proc-pid") == 0
    assert 1 <= _fn(s, "fnstream_pool_slots", "proc-pid") <= 2  # of the ready workers, instanceConcurrency 1
    assert _fn(s, "fnstream_pool_busy_slots", "proc-pid") == 0
    assert _fn(s, "fnstream_pool_waiting", "proc-pid") == 0
    assert ("fnstream_pool_cold_starts_total", (("function", "proc-pid"), ("tenant", "default"))) in s
    assert ("fnstream_sessions_moved_total", (("function", "proc-pid"), ("tenant", "default"))) in s
    assert ("fnstream_pool_restarts_total", (("function", "proc-pid"), ("tenant", "default"))) in s
    assert _fn(s, "fnstream_invocations_total", "proc-pid", outcome="ok", code="0") == 1


TENANT_TOKENS = [{"token": "dev-acme", "tenant": "acme", "role": "developer"},
                 {"token": "dev-bravo", "tenant": "bravo", "role": "developer"},
                 {"token": "root", "tenant": "ops", "role": "admin"}]


async def test_a_developer_scrapes_only_its_own_tenant(make_client, deploy_dir):
    deploy = deploy_dir(fn("acme-fn", "observed_fns.record", tenant="acme"),
                        fn("bravo-secret-fn", "observed_fns.record", tenant="bravo"))
    overrides = {"auth.tokens": TENANT_TOKENS}
    client = await make_client(config=test_config(deploy, **overrides))
    for token, name in (("dev-acme", "acme-fn"), ("dev-bravo", "bravo-secret-fn")):
        auth = {"Authorization": f"Bearer {token}"}
        assert (await client.post(f"/serverless/v1/functions/{name}/invocations", json={}, headers=auth)).status == 200
        assert (await client.post(f"/serverless/v1/streams/{name}-stream", json=["x"], headers=auth)).status == 200

    resp = await client.get("/metrics", headers={"Authorization": "Bearer dev-acme"})
    text = await resp.text()
    assert resp.status == 200 and "bravo" not in text  # neither bravo's names nor its tenant
    s = _samples(text)
    assert _fn(s, "fnstream_invocations_total", "acme-fn", tenant="acme", outcome="ok", code="0") == 1
    assert _fn(s, "fnstream_inflight", "acme-fn", tenant="acme") == 0
    assert _value(s, "fnstream_stream_produced_total", tenant="acme", stream="acme-fn-stream") == 1
    assert _value(s, "fnstream_streams", tenant="acme") == 1
    assert {dict(labels).get("tenant", "acme") for _, labels in s} == {"acme"}  # node-wide series have none

    for everyone in (await _scrape(client, Authorization="Bearer root"),
                     await _scrape(await make_client(config=test_config(deploy, **overrides, **{"metrics.public":
                                                                                                 True})))):
        assert ("fnstream_inflight", (("function", "bravo-secret-fn"), ("tenant", "bravo"))) in everyone
        assert ("fnstream_inflight", (("function", "acme-fn"), ("tenant", "acme"))) in everyone
    s = await _scrape(client, Authorization="Bearer root")
    assert _value(s, "fnstream_stream_produced_total", tenant="bravo", stream="bravo-secret-fn-stream") == 1
    assert _fn(s, "fnstream_invocations_total", "bravo-secret-fn", tenant="bravo", outcome="ok", code="0") == 1


async def _job_status(client, function: str, job_id: str, final: bool = True) -> str:
    for _ in range(500):
        status = (await (await client.get(f"/v2/{function}/status/{job_id}")).json())["status"]
        if not final or status not in ("IN_QUEUE", "IN_PROGRESS"):
            return status
        await asyncio.sleep(0.02)
    return status


async def test_job_metrics_by_status_and_finished_totals(metered):
    client = await metered()
    run = "/v2/{}/run".format
    held = (await (await client.post(run("job-sleeper"), json={"input": {"seconds": 30}})).json())["id"]
    queued = (await (await client.post(run("job-sleeper"), json={"input": {"seconds": 0}})).json())["id"]
    for _ in range(500):
        if (await (await client.get(f"/v2/job-sleeper/status/{held}")).json())["status"] == "IN_PROGRESS":
            break
        await asyncio.sleep(0.02)
    s = await _scrape(client)
    assert _fn(s, "fnstream_jobs", "job-sleeper", status="running") == 1
    assert _fn(s, "fnstream_jobs", "job-sleeper", status="queued") == 1
    assert _fn(s, "fnstream_jobs", "job-sleeper", status="completed") == 0
    for job_id in (queued, held):
        assert (await (await client.post(f"/v2/job-sleeper/cancel/{job_id}")).json())["status"] == "CANCELLED"
    for function in ("job-echo", "job-raises"):
        job_id = (await (await client.post(run(function), json={"input": {}})).json())["id"]
        assert await _job_status(client, function, job_id) in ("COMPLETED", "FAILED")
    s = await _scrape(client)
    assert _fn(s, "fnstream_jobs", "job-sleeper", status="cancelled") == 2
    assert _fn(s, "fnstream_jobs", "job-sleeper", status="running") == 0
    assert _fn(s, "fnstream_jobs_finished_total", "job-sleeper", status="cancelled") == 2
    assert _fn(s, "fnstream_jobs_finished_total", "job-echo", status="completed") == 1
    assert _fn(s, "fnstream_jobs_finished_total", "job-raises", status="failed") == 1
    assert _fn(s, "fnstream_jobs", "job-echo", status="completed") == 1
    assert _fn(s, "fnstream_job_duration_seconds_count", "job-echo") == 1
    assert _fn(s, "fnstream_job_delay_seconds_count", "job-echo") == 1
    assert _fn(s, "fnstream_job_delay_seconds_count", "job-sleeper") == 1  # the queued one never started
    assert _fn(s, "fnstream_job_duration_seconds_count", "job-sleeper") == 1


async def test_session_metrics_open_deleted_expired(metered):
    client = await metered()
    url = "/serverless/v1/functions/record/invocations"

    async def turn(sid: str, ttl: float = 600) -> None:
        header = json.dumps({"sessionID": sid, "sessionTTL": ttl})
        assert (await client.post(url, json={}, headers={"X-Instance-Session": header})).status == 200

    await turn("kept")
    await turn("kept")
    await turn("deleted")
    await turn("brief", ttl=0.05)
    s = await _scrape(client)
    assert _fn(s, "fnstream_sessions_opened_total", "record") == 3
    assert (await client.delete("/serverless/v1/functions/record/sessions/deleted")).status == 200
    for _ in range(100):  # the table is swept at most once a second
        s = await _scrape(client)
        if _fn(s, "fnstream_sessions_ended_total", "record", reason="expired"):
            break
        await asyncio.sleep(0.05)
    assert _fn(s, "fnstream_sessions_ended_total", "record", reason="expired") == 1
    assert _fn(s, "fnstream_sessions_ended_total", "record", reason="deleted") == 1
    assert _fn(s, "fnstream_sessions", "record") == 1
    assert _fn(s, "fnstream_sessions_refused_total", "record") == 0


async def test_a_scrape_reports_at_most_max_functions_the_most_invoked_first(make_client, deploy_dir):
    """With more functions than `metrics.maxFunctions`, a scrape's series are those of the most invoked
    (its size stops growing with the function count) and a gauge says how many were left out."""
    functions = [fn(name, "testfns.echo_sync") for name in ("fa", "fb", "fc", "fd")]
    client = await make_client(test_config(deploy_dir(*functions), **{"metrics.maxFunctions": 2}))
    for name, times in (("fc", 3), ("fa", 2), ("fb", 1)):
        for _ in range(times):
            assert (await client.post(f"/serverless/v1/functions/{name}/invocations", json={})).status == 200
    samples = _samples(await (await client.get("/metrics")).text())
    shown = {dict(labels).get("function") for (_name, labels) in samples} - {None}
    assert shown == {"fa", "fc"}, shown
    assert _value(samples, "fnstream_metrics_functions_omitted") == 2
    assert _fn(samples, "fnstream_invocations_total", "fc", outcome="ok", code="0") == 3
