"""W3C trace context and request ids: traceparent in, trace id everywhere, traceparent out; JSON logs."""
import json
import urllib.request

import pytest

from tests.support.servers import HANDLERS, ServerProcess, fn, test_config

INVOKE = "/serverless/v1/functions/info/invocations"
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
async def traced(make_client, deploy_dir):
    return await make_client(config=test_config(deploy_dir(fn("info", "testfns.context_info"))))


async def test_incoming_traceparent_becomes_the_invocations_trace_id(traced):
    resp = await traced.post(INVOKE, json={}, headers={"traceparent": PARENT})
    body = await resp.json()
    assert body["trace_id"] == body["request_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert resp.headers["X-Trace-Id"] == resp.headers["X-Request-Id"] == body["trace_id"]
    version, trace_id, span, flags = resp.headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", body["trace_id"], "01")
    assert span != "b7ad6b7169203331"  # this server's own span


@pytest.mark.parametrize("bad", ["", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                                 "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                                 "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                                 "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"])
async def test_invalid_traceparent_gets_a_new_trace(traced, bad):
    resp = await traced.post(INVOKE, json={}, headers={"traceparent": bad})
    body = await resp.json()
    assert body["trace_id"] != "0af7651916cd43dd8448eb211c80319c" and len(body["trace_id"]) == 32
    assert resp.headers["traceparent"].split("-")[1] == body["trace_id"]


async def test_without_trace_headers_a_new_trace_is_made_and_named_on_every_answer(traced):
    first = await traced.post(INVOKE, json={})
    second = await traced.post(INVOKE, json={})
    ids = [(await r.json())["trace_id"] for r in (first, second)]
    assert ids[0] != ids[1]
    for resp, trace_id in zip((first, second), ids, strict=True):
        assert resp.headers["traceparent"].split("-")[1] == trace_id == resp.headers["X-Request-Id"]
    for resp in (await traced.get("/healthz"), await traced.get("/nope"), await traced.post(INVOKE, data=b"{")):
        assert resp.headers["X-Request-Id"] == resp.headers["X-Trace-Id"]
        assert resp.headers["traceparent"].split("-")[1] == resp.headers["X-Trace-Id"]


async def test_custom_x_trace_id_is_kept(traced):
    resp = await traced.post(INVOKE, json={}, headers={"X-Trace-Id": "my-request-7"})
    assert (await resp.json())["trace_id"] == "my-request-7"
    assert resp.headers["X-Request-Id"] == "my-request-7"
    assert "traceparent" not in resp.headers  # not a W3C trace id: no traceparent can name it


def test_json_logs_name_trace_function_and_invocation(deploy_dir):
    deploy = deploy_dir(fn("logs", "observed_fns.logs"))
    server = ServerProcess("--deploy-dir", str(deploy), "-s", f"runtime.codeRoots={json.dumps([str(HANDLERS)])}",
                           "-s", "logging.format=json")
    try:
        req = urllib.request.Request(server.url + "/serverless/v1/functions/logs/invocations", data=b"{}",
                                     headers={"traceparent": PARENT, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
            invocation_id = r.headers["X-Invocation-Id"]
    finally:
        output = server.stop()
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    said = [r for r in records if r["message"] == "handler says hello"]
    assert said, output
    assert said[0]["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert said[0]["function"] == "logs" and said[0]["logger"] == "fnstream.function.logs"
    assert said[0]["invocation_id"] == invocation_id and said[0]["level"] == "INFO"  # the answer's id
    access = [r for r in records if "/serverless/v1/functions/logs/invocations" in r["message"]]
    assert access and access[0]["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
