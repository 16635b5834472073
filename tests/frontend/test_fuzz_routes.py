"""Property-based fuzzing of every route against a real `fnstream serve` (Hypothesis, bounded budget).

Properties: no 5xx except a handler's own error; every answer with a status >= 400 is JSON in its
route's documented shape (`{"code", "message"}`, or `{"error": {...}}` under /v1/); `/healthz`
still answers after each batch.
"""
from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.servers import ServerProcess

BUDGET = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                  derandomize=True)
HANDLER_CODES = {4001, 4007}  # a handler's own failure (raised, or a result that cannot be encoded)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
hostile_bytes = st.sampled_from([b"", b"{", b"[1,", b"NaN", b"[Infinity]", b'{"a": 1e400}', b'"\\ud800"',
                                 b"1" + b"0" * 5000, b"\xff\xfe", b"[" * 3000, b"a: &a [1]\nb: *a",
                                 b"\x93\xc7\x01\x05x", b"\x91\x81\xc4\x01k\x01", b"null", b"[null]"])
bodies = st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=300), hostile_bytes,
                   st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
header_values = st.one_of(st.sampled_from(["", "0", "-1", "1e400", "9" * 400, "nan", "text/event-stream",
                                           "application/x-msgpack", "application/json;q=0", "*/*"]),
                          st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40))
headers = st.dictionaries(st.sampled_from(["Accept", "Content-Type", "X-Expect-Num", "Last-Event-ID",
                                           "X-Stream-Terminator", "X-Trace-Id", "Authorization", "X-Tenant-ID"]),
                          header_values, max_size=4)
names = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=30)


@pytest.fixture(scope="module")
def fuzz_server():
    server = ServerProcess("-s", "streams.subscribeTimeoutMs=100", env={"FNSTREAM_LOG": "WARNING"})
    yield server
    server.stop()


def request(server: ServerProcess, method: str, path: str, body: bytes | None = None,
            hdrs: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    try:
        conn.request(method, path, body=body, headers=hdrs or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def check(path: str, status: int, content_type: str, raw: bytes) -> None:
    if status < 400:
        return
    assert content_type.startswith("application/json"), (path, status, raw[:200])
    body = json.loads(raw)
    if path.startswith("/v1/"):
        assert set(body) == {"error"} and {"message", "type"} <= set(body["error"]), body
        code = body["error"].get("code")
    else:
        assert isinstance(body.get("code"), int) and isinstance(body.get("message"), str), body
        code = body["code"]
    assert status < 500 or code in HANDLER_CODES or status == 503, (path, status, body)


def healthy(server: ServerProcess) -> None:
    status, _ct, raw = request(server, "GET", "/healthz")
    assert status == 200 and json.loads(raw)["status"] == "ok"


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@BUDGET
@given(body=bodies, hdrs=headers, short=st.booleans())
def test_fuzz_invoke(fuzz_server, body, hdrs, short):
    path = "/invocations/default/default/echo/" if short else "/serverless/v1/functions/echo/invocations"
    check(path, *request(fuzz_server, "POST", path, body, hdrs))


@BUDGET
@given(name=names, body=bodies, hdrs=headers, query=st.sampled_from(["", "?retain_num=2", "?retain_seconds=1e400",
                                                                     "?policy=x", "?timeout_ms=" + "9" * 30]))
def test_fuzz_streams(fuzz_server, name, body, hdrs, query):
    path = f"/serverless/v1/streams/{q(name)}"
    check(path, *request(fuzz_server, "POST", path + query, body, hdrs))
    sub_headers = {**hdrs, "X-Expect-Num": "1"} if "X-Expect-Num" not in hdrs else hdrs
    check(path, *request(fuzz_server, "GET", path + "?timeout_ms=50", None, sub_headers))
    check(path, *request(fuzz_server, "GET", f"/serverless/v1/streams?stream={q(name)}", None, hdrs))
    check(path, *request(fuzz_server, "DELETE", path, None, hdrs))
    check("/serverless/v1/stream/subscribe", *request(fuzz_server, "GET", "/serverless/v1/stream/subscribe",
                                                      None, {**hdrs, "X-Timeout-Ms": "50"}))


@BUDGET
@given(body=bodies, name=names, method=st.sampled_from(["POST", "PUT", "GET", "DELETE"]))
def test_fuzz_admin(fuzz_server, body, name, method):
    path = "/admin/v1/functions" if method == "POST" else f"/admin/v1/functions/{q(name)}"
    if method == "PUT" and name != "echo":
        path = "/admin/v1/functions/fuzzed"
    check(path, *request(fuzz_server, method, path, body if method in ("POST", "PUT") else None))


@BUDGET
@given(body=st.one_of(bodies, st.fixed_dictionaries({"model": st.text(max_size=10), "stream": st.booleans(),
                                                     "messages": st.lists(json_values, max_size=3)},
                                                    optional={"max_tokens": st.integers()}).map(
    lambda d: json.dumps(d).encode())), route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    hdrs=headers)
def test_fuzz_openai(fuzz_server, body, route, hdrs):
    check(route, *request(fuzz_server, "POST", route, body, hdrs))


@BUDGET
@given(path=st.one_of(st.sampled_from(["/v1/models", "/healthz", "/serverless/v1/streams", "/nope"]),
                      names.map(lambda n: f"/v1/models/{q(n)}")), hdrs=headers)
def test_fuzz_reads(fuzz_server, path, hdrs):
    status, ct, raw = request(fuzz_server, "GET", path, None, hdrs)
    if path != "/nope":
        check(path, status, ct, raw)
    else:
        assert status == 404 and ct.startswith("application/json")


def test_healthz_after_the_batches(fuzz_server):
    healthy(fuzz_server)
    assert fuzz_server.proc.poll() is None
