"""The front door (frontend/front_door.py): which requests its fast lane takes, that a plain
invoke (JSON or SSE) gets the same answer and is counted the same through it as through the app
(router, middlewares, route) — in-process, process and cluster-queued functions alike —, and that
the lane steps aside for a middleware or response-prepare hook the app was given after build_app.

The rest of the suite drives the fast lane too: `make_client` serves its app as `fnstream serve`
does (FnstreamRunner), so every plain JSON call of the metrics, auth and tenancy tests goes
through it, and tests/frontend/test_invoke.py runs through each door; here each answer is also
held to the app path's, over real sockets.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import TestServer, make_mocked_request
from prometheus_client.parser import text_string_to_metric_families

from frontend.app import build_app
from frontend.front_door import INVOKE_LANE, FrontDoor
from frontend.keys import REGISTRY
from tests.support.cluster import CLUSTER_FUNCTIONS, RELAY, status, wait_until
from tests.support.servers import FUNCTIONS, FnstreamTestServer, fn, make_config, test_config
from tests.support.waiting import eventually

INVOKE = "/serverless/v1/functions/{}/invocations".format
TOKENS = [{"token": "user-a", "tenant": "default", "role": "user"},
          {"token": "user-b", "tenant": "acme", "role": "user"},
          {"token": "admin", "tenant": "default", "role": "admin"}]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


# -- which requests the fast lane takes -------------------------------------------------------------

def _request(method: str, path: str, headers: dict[str, str], body: bytes | None) -> web.Request:
    protocol = make_mocked_request("GET", "/").protocol
    payload = StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    if body is not None:  # None: the body is still arriving
        payload.feed_data(body)
        payload.feed_eof()
    return make_mocked_request(method, path, headers={"Content-Type": "application/json", **headers},
                               payload=payload)


URN = "sn:cn:yrk:default:function:0-default-echo:latest"
LANE_CASES = [
    ("POST", INVOKE("echo"), {}, b"{}", ("echo", "json")),
    ("POST", INVOKE("echo") + "?x=1", {}, b"{}", ("echo", "json")),
    ("POST", INVOKE(URN), {}, b"{}", (URN, "json")),
    ("POST", INVOKE("echo"), {"Accept": "application/json"}, b"", ("echo", "json")),
    ("POST", INVOKE("echo"), {"Accept": "*/*"}, b"{}", ("echo", "json")),
    ("POST", INVOKE("echo"), {"Authorization": "Bearer t", "traceparent": "x"}, b"{}", ("echo", "json")),
    ("POST", INVOKE("echo"), {"Accept": "text/event-stream"}, b"{}", ("echo", "sse")),
    ("POST", INVOKE("echo"), {"Accept": "application/json;q=0.5, text/event-stream"}, b"{}", ("echo", "sse")),
    # the app path's
    ("GET", INVOKE("echo"), {}, b"", None),
    ("POST", INVOKE("echo"), {"Origin": "http://page.example"}, b"{}", None),
    ("POST", INVOKE("echo"), {"Expect": "100-continue"}, b"{}", None),
    ("POST", INVOKE("echo"), {"X-Invoke-Type": "async"}, b"{}", None),
    ("POST", INVOKE("echo"), {"x-instance-session": '{"sessionID": "s"}'}, b"{}", None),
    ("POST", INVOKE("echo"), {"Content-Encoding": "gzip"}, b"{}", None),
    ("POST", INVOKE("echo"), {}, None, None),
    ("POST", INVOKE("ec%68o"), {}, b"{}", None),
    ("POST", INVOKE("echo#"), {}, b"{}", None),        # a fragment, to the router
    ("POST", INVOKE("ec{ho}"), {}, b"{}", None),
    ("POST", INVOKE("a/b"), {}, b"{}", None),
    ("POST", INVOKE(""), {}, b"{}", None),
    ("POST", INVOKE("echo") + "/", {}, b"{}", None),
    ("POST", "/invocations/default/default/echo/", {}, b"{}", None),
    ("POST", "/serverless/v1/functions/async-results/x", {}, b"{}", None),
]


@pytest.mark.parametrize("method, path, headers, body, taken", LANE_CASES)
async def test_the_fast_lane_takes_plain_invokes_only(method, path, headers, body, taken):
    door = FrontDoor(build_app(test_config(**{"frontend.args.enableEvent": True})), _never)
    assert door._lane(_request(method, path, headers, body)) == taken


async def test_sse_refused_by_config_is_the_apps_406():
    door = FrontDoor(build_app(test_config(**{"frontend.args.enableEvent": False})), _never)
    request = _request("POST", INVOKE("echo"), {"Accept": "text/event-stream"}, b"{}")
    assert door._lane(request) is None


async def test_no_fast_lane_when_the_runner_says_so():
    door = FrontDoor(build_app(test_config()), _never, fast_lane=False)
    assert door._lane(_request("POST", INVOKE("echo"), {}, b"{}")) is None


@web.middleware
async def _stamping(request: web.Request, handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers["X-Stamped-By"] = "middleware"
    return response


async def _stamp(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Stamp"] = "hook"


@pytest.mark.parametrize("add", ["middleware", "hook"])
async def test_the_fast_lane_steps_aside_for_what_the_app_was_given_after_build_app(add):
    app = build_app(test_config())
    if add == "middleware":
        app.middlewares.append(_stamping)
    else:
        app.on_response_prepare.append(_stamp)
    door = FrontDoor(app, _never)
    assert door._lane(_request("POST", INVOKE("echo"), {}, b"{}")) is None
    # What build_app installs itself the lane does the work of: CORS's hook, cluster's middleware.
    cors = build_app(test_config(**{"frontend.cors.allowOrigins": ["http://page.example"]}))
    assert FrontDoor(cors, _never)._lane(_request("POST", INVOKE("echo"), {}, b"{}")) == ("echo", "json")


async def _never(request: web.Request) -> web.StreamResponse:
    raise AssertionError("not called")


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
async def test_a_hook_or_middleware_added_to_the_app_reaches_both_doors(aiohttp_client, deploy_dir, accept):
    """An `on_response_prepare` hook and a middleware the app is given after build_app stamp the
    answer of a plain invoke whichever door it came in by (a middleware comes too late for an
    SSE answer's headers, on either door)."""
    config = test_config(deploy_dir(fn("aecho", "testfns.echo_async"), fn("ticker", "testfns.sync_ticker")),
                         **{"frontend.args.enableEvent": True, "jobs.store": "memory"})  # two servers
    stamps = []
    for fast_lane in (True, False):
        app = build_app(config)
        app.on_response_prepare.append(_stamp)
        app.middlewares.append(_stamping)
        client = await aiohttp_client(FnstreamTestServer(app, fast_lane=fast_lane))
        function, body = ("aecho", {"a": 1}) if accept == "application/json" else ("ticker", {"count": 2})
        resp = await client.post(INVOKE(function), json=body, headers={"Accept": accept})
        assert resp.status == 200, await resp.text()
        await resp.read()
        stamps.append((resp.headers.get("X-Stamp"), resp.headers.get("X-Stamped-By")))
    assert stamps[0] == stamps[1] == ("hook", "middleware" if accept == "application/json" else None)


# -- the same answers as the app path -------------------------------------------------------------

@pytest.fixture
async def both(aiohttp_client, deploy_dir):
    """(the app served by FnstreamRunner — the front door —, the same app served by aiohttp's AppRunner)."""
    deploy = deploy_dir(fn("aecho", "testfns.echo_async"), fn("secho", "testfns.echo_sync"),
                        fn("raises", "testfns.raise_early"), fn("none", "testfns.returns_none"),
                        fn("bad-result", "testfns.not_serializable"), fn("gen", "testfns.gen"),
                        fn("agen", "testfns.agen"), fn("mine-b", "testfns.echo_async", tenant="acme"),
                        fn("sleeper", "testfns.async_sleep", timeout=0.3), fn("ticker", "testfns.sync_ticker"),
                        fn("raw", "testfns.self_framed", rawStream=True), fn("mid", "testfns.raise_mid"))
    config = test_config(deploy, **{"auth.tokens": TOKENS, "frontend.args.maxRequestBodySize": 0.001,
                                    "jobs.store": "memory", "frontend.args.enableEvent": True})  # two servers
    door = await aiohttp_client(FnstreamTestServer(build_app(config)))
    app = await aiohttp_client(TestServer(build_app(config)))
    return door, app


def _shape(status: int, headers, body: bytes, sent_trace: str | None) -> dict:
    """What an answer says, less what differs on every call (trace ids, durations)."""
    data = json.loads(body)
    trace_id = headers["X-Trace-Id"]
    if isinstance(data, dict) and data.get("trace_id") == trace_id:
        data["trace_id"] = "<trace id>"
    traceparent = headers.get("traceparent")
    return {"status": status, "body": data, "content-type": headers["Content-Type"],
            "inner-code": headers["X-Inner-Code"], "request-id": headers["X-Request-Id"] == trace_id,
            "trace-id": trace_id == sent_trace if sent_trace else len(trace_id) == 32,
            "traceparent": traceparent.split("-")[1::2] == [trace_id, traceparent[-2:]] if traceparent else None,
            "billing": "X-Billing-Duration" in headers}


CALLS = [
    ("aecho", {"Authorization": "Bearer user-a"}, b'{"a": [1, 2.5, "\\u00e9"]}'),
    ("secho", {"X-Auth": "user-a"}, b'{"b": null}'),
    ("aecho", {"Authorization": "Bearer user-a"}, b""),
    ("aecho", {"Authorization": "Bearer user-a"}, b"  \n"),
    ("aecho", {"Authorization": "Bearer user-a", "traceparent": f"00-{TRACE}-00f067aa0ba902b7-00"}, b"[]"),
    ("aecho", {"Authorization": "Bearer user-a", "X-Trace-Id": "my-own-id"}, b"1"),
    ("aecho", {"Authorization": "Bearer user-a", "X-Trace-Id": TRACE}, b'" x "'),
    ("aecho", {"Authorization": "Bearer user-a", "Accept": "application/json"}, b"{}"),
    ("aecho", {}, b"{}"),                                          # 401 missing
    ("aecho", {"Authorization": "Bearer nope"}, b"{}"),            # 401 invalid
    ("mine-b", {"Authorization": "Bearer user-a"}, b"{}"),         # another tenant's: 404
    ("mine-b", {"Authorization": "Bearer user-b"}, b"{}"),
    ("missing", {"Authorization": "Bearer user-a"}, b"{}"),        # 404
    ("aecho", {"Authorization": "Bearer user-a"}, b'{"a": '),      # 400
    ("aecho", {"Authorization": "Bearer user-a"}, b'{"a": NaN}'),  # 400
    ("aecho", {"Authorization": "Bearer user-a"}, b'{"a": 1} x'),  # 400
    ("aecho", {"Authorization": "Bearer user-a"}, b"\xff\xfe"),    # 400
    ("aecho", {"Authorization": "Bearer user-a"}, b'["' + b"x" * 2000 + b'"]'),  # 413
    ("raises", {"Authorization": "Bearer user-a"}, b"{}"),         # 500, 4001
    ("none", {"Authorization": "Bearer user-a"}, b"{}"),
    ("bad-result", {"Authorization": "Bearer user-a"}, b"{}"),
    ("gen", {"Authorization": "Bearer user-a"}, b'{"count": 3}'),
    ("agen", {"Authorization": "Bearer user-a"}, b'{"count": 3}'),
    ("sleeper", {"Authorization": "Bearer user-a"}, b'{"seconds": 5}'),  # 504
]


async def _json_answer(client, function: str, headers: dict[str, str], body: bytes) -> dict:
    resp = await client.post(INVOKE(function), data=body, headers=headers)
    return _shape(resp.status, resp.headers, await resp.read(),
                  headers.get("X-Trace-Id") or (TRACE if "traceparent" in headers else None))


@pytest.mark.parametrize("function, headers, body", CALLS)
async def test_a_plain_json_call_gets_the_app_paths_answer(both, function, headers, body):
    answers = [await _json_answer(client, function, headers, body) for client in both]
    assert answers[0] == answers[1]
    assert answers[0]["trace-id"] and answers[0]["request-id"]


SSE = {"Authorization": "Bearer user-a", "Accept": "text/event-stream"}
STREAMS = [
    ("ticker", SSE, b'{"count": 3, "delay_ms": 1}'),
    ("ticker", {**SSE, "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}, b'{"count": 2, "delay_ms": 1}'),
    ("raw", SSE, b"{}"),                      # rawStream: the handler's own framing
    ("mid", SSE, b"{}"),                      # raises after two events: 200, the error event, [DONE]
    ("raises", SSE, b"{}"),                   # raises before any: 500, the error event, [DONE]
    ("none", SSE, b"{}"),
    ("agen", SSE, b'{"count": 3}'),
    ("aecho", {"Accept": "text/event-stream"}, b"{}"),  # 401
    ("aecho", SSE, b"{"),                     # 400
]


async def _streamed_answer(client, function: str, headers: dict[str, str], body: bytes) -> tuple:
    resp = await client.post(INVOKE(function), data=body, headers=headers)
    h = resp.headers
    traceparent = h.get("traceparent", "")
    return (resp.status, h["Content-Type"], h.get("X-Inner-Code"), h.get("Cache-Control"),
            h["X-Request-Id"] == h["X-Trace-Id"], traceparent.split("-")[1:2] == [h["X-Trace-Id"]],
            h["X-Trace-Id"] == TRACE, (await resp.read()).replace(h["X-Trace-Id"].encode(), b"<id>"))


@pytest.mark.parametrize("function, headers, body", STREAMS)
async def test_a_streamed_call_gets_the_app_paths_answer(both, function, headers, body):
    answers = [await _streamed_answer(client, function, headers, body) for client in both]
    assert answers[0] == answers[1]
    assert answers[0][4] and answers[0][5] and answers[0][6] == ("traceparent" in headers)


async def test_the_fast_lane_asks_required_role_as_the_auth_middleware_does(both, monkeypatch):
    """The role an invoke needs is frontend/auth.py's `required_role(path)` on either door: made
    `developer`, a user token's invoke is refused 403 by the lane as by the app path."""
    import frontend.auth
    import frontend.front_door

    def developer_only(path: str) -> str | None:
        return "developer"
    monkeypatch.setattr(frontend.auth, "required_role", developer_only)
    monkeypatch.setattr(frontend.front_door, "required_role", developer_only)
    answers = [await _json_answer(client, "aecho", {"Authorization": "Bearer user-a"}, b"{}") for client in both]
    assert answers[0] == answers[1]
    assert answers[0]["status"] == 403


async def test_a_client_that_leaves_cancels_its_fast_lane_call(make_client, deploy_dir):
    client = await make_client(test_config(deploy_dir(fn("forever", "testfns.async_forever"))))
    state = client.server.app[REGISTRY].get("forever").code.handler.__globals__["STATE"]  # its own module's
    call = asyncio.ensure_future(client.post(INVOKE("forever"), json={"marker": "door", "sleep": 0.01}))
    for _ in range(200):
        if state["writes"].get("door"):
            break
        await asyncio.sleep(0.01)
    assert state["writes"]["door"] > 0  # running, in the request's own task
    call.cancel()  # the client closes its connection
    for _ in range(200):
        if ("cancelled", "door") in state["log"]:
            break
        await asyncio.sleep(0.01)
    assert ("cancelled", "door") in state["log"]
    resp = await client.get("/metrics")
    assert 'fnstream_invocations_total{code="disconnected",function="forever",outcome="disconnected",' \
           'tenant="default"} 1.0' in await resp.text()


@pytest.mark.allow_blocking
def test_a_fast_lane_streams_log_lines_name_its_trace(deploy_dir):
    """The lane sets the request's log context as the error middleware does: the invoke route's own
    line about a stream that failed mid-way names the trace (a real server; JSON logs)."""
    import urllib.request

    from tests.support.servers import HANDLERS, ServerProcess

    server = ServerProcess("--deploy-dir", str(deploy_dir(fn("mid", "testfns.raise_mid"))),
                           "-s", f"runtime.codeRoots={json.dumps([str(HANDLERS)])}", "-s", "logging.format=json")
    try:
        req = urllib.request.Request(server.url + INVOKE("mid"), data=b"{}",
                                     headers={"Accept": "text/event-stream", "X-Trace-Id": "lane-trace-7"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert b"boom after two events" in resp.read()
    finally:
        output = server.stop()
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    failed = [r for r in records if "failed after 2 events" in r["message"]]
    assert failed and failed[0].get("trace_id") == "lane-trace-7", output[-3000:]


# -- counted the same; process functions; cluster mode --------------------------------------------

# What a scrape says about invocations that does not depend on timing (durations only as counts).
_COUNTED = ("fnstream_invocations_total", "fnstream_timeouts_total", "fnstream_client_disconnects_total",
            "fnstream_throttled_total", "fnstream_invocation_duration_seconds_count",
            "fnstream_time_to_first_event_seconds_count", "fnstream_stream_events_total",
            "fnstream_stream_bytes_total")


async def _counted(client, headers: dict[str, str]) -> dict:
    resp = await client.get("/metrics", headers=headers)
    assert resp.status == 200, await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(await resp.text()) for s in family.samples
            if s.name in _COUNTED}


async def _count_the_same(doors, headers: dict[str, str], invocations: int) -> dict:
    """The doors' counts, once both counted `invocations` (a stream is counted as its response
    ends, which its client may see first): equal, sample for sample."""
    async def settled():
        counts = [await _counted(client, headers) for client in doors]
        totals = [sum(v for (name, _), v in c.items() if name == "fnstream_invocations_total") for c in counts]
        return counts if totals == [invocations] * len(doors) else None
    counts = await eventually(settled, f"both doors to count {invocations} invocations")
    assert counts[0] == counts[1]
    return counts[0]


async def _two_doors(aiohttp_client, config) -> tuple[list, list[list[str]]]:
    """Clients of two apps built from `config`, with the fast lane and without; and, for each, the
    functions its lane served (its `InvokeLane.serve` counted: the invoke route calls the invoker itself)."""
    clients, served = [], []
    for fast_lane in (True, False):
        app = build_app(config() if callable(config) else config)
        lane, took = app[INVOKE_LANE], []

        def serve(request, ref, *rest, _serve=lane.serve, _took=took):
            _took.append(ref)
            return _serve(request, ref, *rest)
        app[INVOKE_LANE] = lane._replace(serve=serve)
        clients.append(await aiohttp_client(FnstreamTestServer(app, fast_lane=fast_lane)))
        served.append(took)
    return clients, served


ADMIN = {"Authorization": "Bearer admin"}
USER = {"Authorization": "Bearer user-a"}
SSE_USER = {**USER, "Accept": "text/event-stream"}
# (function, headers, body, counted: it reached its function), through each door in turn.
METERED = [
    ("aecho", USER, b'{"a": 1}', True), ("secho", USER, b"[1]", True), ("raises", USER, b"{}", True),
    ("sleeper", USER, b'{"seconds": 5}', True),                       # 504, a timeout
    ("aecho", {}, b"{}", False), ("missing", USER, b"{}", False), ("aecho", USER, b"{", False),
    ("aecho", USER, b'["' + b"x" * 2000 + b'"]', False),                # 401, 404, 400, 413
    ("p-echo", USER, b'{"p": [1, 2]}', True), ("p-raises", USER, b"{}", True),
    ("p-echo", USER, b"{", False), ("p-ticker", USER, b'{"count": 2, "delay_ms": 1}', True),
    ("ticker", SSE_USER, b'{"count": 3, "delay_ms": 1}', True), ("mid", SSE_USER, b"{}", True),
    ("p-ticker", SSE_USER, b'{"count": 3, "delay_ms": 1}', True), ("p-raises", SSE_USER, b"{}", True),
    ("p-echo", SSE_USER, b"{}", True), ("aecho", {"Accept": "text/event-stream"}, b"{}", False),
]


async def test_both_doors_answer_and_count_in_process_and_process_functions_alike(aiohttp_client, deploy_dir):
    """The same calls (JSON and SSE; successes, handler errors, a timeout, refusals) through each
    door, of in-process and `executor: process` functions: the same answers, and the same counts
    in /metrics (by function and outcome, events and bytes streamed)."""
    process = {"executor": "process", "instances": 1}
    deploy = deploy_dir(fn("aecho", "testfns.echo_async"), fn("secho", "testfns.echo_sync"),
                        fn("raises", "testfns.raise_early"), fn("sleeper", "testfns.async_sleep", timeout=0.3),
                        fn("ticker", "testfns.sync_ticker"), fn("mid", "testfns.raise_mid"),
                        fn("p-echo", "testfns.echo_sync", **process), fn("p-raises", "testfns.raise_early", **process),
                        fn("p-ticker", "testfns.sync_ticker", **process))
    config = test_config(deploy, **{"auth.tokens": TOKENS, "frontend.args.maxRequestBodySize": 0.001,
                                    "jobs.store": "memory", "frontend.args.enableEvent": True})
    doors, served = await _two_doors(aiohttp_client, config)
    for function, headers, body, _counted_too in METERED:
        answer = _streamed_answer if headers.get("Accept") == "text/event-stream" else _json_answer
        answers = [await answer(client, function, headers, body) for client in doors]
        assert answers[0] == answers[1], function
    counts = await _count_the_same(doors, ADMIN, sum(counted for *_, counted in METERED))
    ok = ("fnstream_invocations_total", (("code", "0"), ("function", "p-echo"), ("outcome", "ok"),
                                         ("tenant", "default")))
    assert counts[ok] == 2  # (a process function's JSON and SSE calls)
    # Every call by its door (a 401 is the lane's own answer: no invoke)
    assert served == [[function for function, headers, *_ in METERED if "Authorization" in headers], []]


async def test_both_doors_answer_and_count_cluster_queued_calls_alike(redis_server, start_worker, aiohttp_client):
    """Two frontends (`cluster.role: frontend`, nothing runs in them) on one Redis, one with the
    fast lane and one without, and a worker node: a call queued for the worker, JSON or SSE, gets
    the same answer and the same counts through either door."""
    def config():
        return make_config(**{"cluster.redisUrl": redis_server.url, "cluster.role": "frontend",
                              "cluster.workerHeartbeatSeconds": 0.2, "cluster.registrySyncSeconds": 0.5,
                              "runtime.codeRoots": [str(FUNCTIONS), str(CLUSTER_FUNCTIONS)],
                              "frontend.args.enableEvent": True})
    doors, served = await _two_doors(aiohttp_client, config)
    start_worker(redis_server.url)
    resp = await doors[0].post("/admin/v1/functions", json=RELAY)
    assert resp.status == 201, await resp.text()
    for client in doors:
        async def serving(client=client):
            # The other frontend learns of the deploy at its next registry sync, on its own clock.
            async with client.get("/admin/v1/functions/relay") as known:
                if known.status != 200:
                    return False
            st = await status(client.session, str(client.make_url("")).rstrip("/"))
            return any("relay" in w["functions"] for w in st["workers"])
        await wait_until(serving, "relay known to each frontend, and a worker serving it seen by each")
    calls = [("relay", {}, b'{"count": 2, "delay_ms": 1}', True), ("relay", {}, b"{", False),
             ("missing", {}, b"{}", False),
             ("relay", {"Accept": "text/event-stream"}, b'{"count": 3, "delay_ms": 1}', True)]
    for function, headers, body, _counted_too in calls:
        answer = _streamed_answer if headers.get("Accept") == "text/event-stream" else _json_answer
        answers = [await answer(client, function, headers, body) for client in doors]
        assert answers[0] == answers[1], function
    await _count_the_same(doors, {}, 2)
    assert served == [[function for function, *_ in calls], []]
