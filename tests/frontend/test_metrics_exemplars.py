"""`/metrics` in OpenMetrics (asked for by `Accept`, as Prometheus asks): the invocation duration
histogram's buckets carry exemplars naming invocation ids (issue 28 §1), through either door."""
from __future__ import annotations

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.support.servers import fn, test_config

INVOKE = "/serverless/v1/functions/{}/invocations".format
# What Prometheus 2.x sends
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
DOORS = {"fast lane": {}, "app path": {"Origin": "http://page.example"}}


@pytest.fixture
async def client(make_client, deploy_dir):
    deploy = deploy_dir(fn("record", "observed_fns.record"), fn("ticker", "testfns.sync_ticker"),
                        fn("fails", "observed_fns.fails"))
    return await make_client(config=test_config(deploy, **{"frontend.args.enableEvent": True,
                                                           "frontend.cors.allowOrigins": ["http://page.example"]}))


def _exemplar_ids(text: str, function: str) -> set[str]:
    ids = set()
    for family in text_string_to_metric_families(text):  # (the whole answer must parse as OpenMetrics)
        if family.name != "fnstream_invocation_duration_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") and s.labels["function"] == function and s.exemplar is not None:
                assert list(s.exemplar.labels) == ["invocation_id"]
                assert s.exemplar.value <= (float(s.labels["le"]))
                ids.add(s.exemplar.labels["invocation_id"])
    return ids


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("function, headers, body, status", [
    ("record", {}, {}, 200),
    ("ticker", {"Accept": "text/event-stream"}, {"count": 2, "delay_ms": 1}, 200),
    ("fails", {}, {}, 500),
], ids=["json", "sse", "error"])
async def test_an_openmetrics_scrape_names_the_recent_invocation(client, door, function, headers, body, status):
    resp = await client.post(INVOKE(function), json=body, headers={**headers, **DOORS[door]})
    await resp.read()
    assert resp.status == status
    inv_id = resp.headers["X-Invocation-Id"]
    scrape = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert scrape.status == 200
    assert scrape.headers["Content-Type"].startswith("application/openmetrics-text")
    text = await scrape.text()
    assert f'# {{invocation_id="{inv_id}"}}' in text
    assert _exemplar_ids(text, function) == {inv_id}
    assert text.endswith("# EOF\n")


async def test_the_text_format_stays_the_default(client):
    resp = await client.post(INVOKE("record"), json={})
    assert resp.status == 200
    for accept in (None, "text/plain", "*/*"):
        scrape = await client.get("/metrics", headers={} if accept is None else {"Accept": accept})
        assert scrape.headers["Content-Type"].startswith("text/plain; version=")
        text = await scrape.text()
        assert "fnstream_invocation_duration_seconds_bucket" in text and "invocation_id" not in text
