"""The tenant boundary, route by route: a `developer` and a `user` token of tenant A (acme) try to
read, change, run, subscribe to, cancel or list what tenant B (default) owns, on every route of
frontend/api_table.py that names something. Each answer is 403/404 (or, for lists and A's own
namespace of stream names, only A's own things), shows nothing of B's, and B's things are unchanged."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.support.servers import make_config
from tests.support.tenants import MODEL, SECRET, SESSION, TOKENS, World, bearer, plant, session_alive, snapshot

DENIED = (403, 404)
SSE = {"Accept": "text/event-stream"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
B_MANIFEST = yaml.safe_dump({"name": "echo", "handler": "hello.handler", "codePath": "."})


@dataclass(frozen=True)
class Probe:
    method: str
    path: str                      # {rp}: B's RunPod job id, {yr}: B's async job id, {iv}: B's SSE invocation
    json: Any = None
    data: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    expect: tuple[int, ...] = DENIED
    user: tuple[int, ...] | None = None   # when a user token gets another answer (a route it lacks the role for)
    check: Callable[[Any], bool] | None = None   # for a 200: what must hold of A's own view


def _names(key: str, name: str = "name") -> Callable[[Any], bool]:
    return lambda body: all(item[name] != "echo" for item in body[key])


def _no_model(body: Any) -> bool:
    return all(m["id"] != MODEL for m in body["data"])


PROBES = {
    # -- invoke (every form names B's function)
    "invoke-json": Probe("POST", "/serverless/v1/functions/echo/invocations", json={}),
    "invoke-sse": Probe("POST", "/serverless/v1/functions/echo/invocations", json={}, headers=SSE),
    "invoke-urn-path": Probe("POST", "/invocations/default/default/echo/", json={}),
    "invoke-async": Probe("POST", "/serverless/v1/functions/echo/invocations", json={},
                          headers={"X-Invoke-Type": "async"}),
    "invoke-in-b-session": Probe("POST", "/serverless/v1/functions/echo/invocations", json={},
                                 headers={"X-Instance-Session": json.dumps({"sessionID": SESSION})}),
    # -- instance sessions
    "session-interrupt": Probe("POST", f"/serverless/v1/functions/echo/sessions/{SESSION}/interrupt"),
    "session-end": Probe("DELETE", f"/serverless/v1/functions/echo/sessions/{SESSION}"),
    "session-via-own-fn": Probe("DELETE", f"/serverless/v1/functions/a-echo/sessions/{SESSION}"),
    # -- jobs: fnstream and openYuanrong
    "yr-async-result": Probe("GET", "/serverless/v1/functions/async-results/{yr}"),
    "job-get": Probe("GET", "/serverless/v1/jobs/{rp}"),
    "job-events": Probe("GET", "/serverless/v1/jobs/{rp}/events", headers=SSE),
    "job-cancel": Probe("DELETE", "/serverless/v1/jobs/{yr}"),
    "job-list": Probe("GET", "/serverless/v1/jobs", expect=(200,), check=lambda b: b["jobs"] == []),
    "job-list-by-fn": Probe("GET", "/serverless/v1/jobs?function=echo", expect=(200,),
                            check=lambda b: b["jobs"] == []),
    # -- an invocation by its X-Invocation-Id (B's SSE one, kept)
    "invocation-events": Probe("GET", "/serverless/v1/invocations/{iv}/events", expect=(404,)),
    "invocation-events-from": Probe("GET", "/serverless/v1/invocations/{iv}/events?from=0", expect=(404,)),
    "invocation-cancel": Probe("POST", "/serverless/v1/invocations/{iv}/cancel", expect=(404,)),
    "invocation-stream": Probe("GET", "/serverless/v1/streams/invocations/{iv}?from_id=0&timeout_ms=100",
                               expect=(400, 200), user=(403,)),
    # -- RunPod /v2 (B's endpoint, or A's own endpoint with B's job id)
    "runpod-run": Probe("POST", "/v2/echo/run", json={"input": {}}),
    "runpod-runsync": Probe("POST", "/v2/echo/runsync", json={"input": {}}),
    "runpod-status": Probe("GET", "/v2/echo/status/{rp}"),
    "runpod-status-own-fn": Probe("GET", "/v2/a-echo/status/{rp}"),
    "runpod-stream": Probe("GET", "/v2/echo/stream/{rp}"),
    "runpod-stream-post-sse": Probe("POST", "/v2/echo/stream/{rp}", headers=SSE),
    "runpod-stream-own-fn": Probe("GET", "/v2/a-echo/stream/{rp}"),
    "runpod-cancel": Probe("POST", "/v2/echo/cancel/{rp}"),
    "runpod-cancel-own-fn": Probe("POST", "/v2/a-echo/cancel/{rp}"),
    "runpod-retry": Probe("POST", "/v2/echo/retry/{rp}"),
    "runpod-retry-own-fn": Probe("POST", "/v2/a-echo/retry/{rp}"),
    "runpod-purge-queue": Probe("POST", "/v2/echo/purge-queue"),
    "runpod-health": Probe("GET", "/v2/echo/health"),
    "runpod-openai-chat": Probe("POST", "/v2/chat/openai/v1/chat/completions", json=CHAT),
    "runpod-openai-completions": Probe("POST", "/v2/chat/openai/v1/completions", json={"model": MODEL,
                                                                                        "prompt": "hi"}),
    "runpod-openai-models": Probe("GET", "/v2/chat/openai/v1/models"),
    # -- OpenAI-compatible, with B's model
    "openai-chat": Probe("POST", "/v1/chat/completions", json=CHAT),
    "openai-chat-sse": Probe("POST", "/v1/chat/completions", json={**CHAT, "stream": True}),
    "openai-completions": Probe("POST", "/v1/completions", json={"model": MODEL, "prompt": "hi"}),
    "openai-model": Probe("GET", f"/v1/models/{MODEL}"),
    "openai-models": Probe("GET", "/v1/models", expect=(200,), check=_no_model),
    # -- admin API (the console's Functions panel)
    "admin-get": Probe("GET", "/admin/v1/functions/echo", user=(403,)),
    "admin-redeploy": Probe("PUT", "/admin/v1/functions/echo", data=B_MANIFEST, user=(403,)),
    "admin-delete": Probe("DELETE", "/admin/v1/functions/echo", user=(403,)),
    "admin-deploy-into-b": Probe("POST", "/admin/v1/functions", data=yaml.safe_dump(
        {"name": "planted", "handler": "echo.handler", "codePath": ".", "tenant": "default"}), user=(403,)),
    # names are per tenant: A's `echo` is A's own, B's stays as it was (the snapshot)
    "admin-list-deploy-same-name": Probe("PUT", "/admin/v1/functions", data=yaml.safe_dump(
        [{"name": "echo", "handler": "hello.handler", "codePath": "."}]), expect=(200,), user=(403,),
        check=lambda b: [f["tenant"] for f in b["functions"]] == ["acme"]),
    "admin-post-same-name": Probe("POST", "/admin/v1/functions", data=yaml.safe_dump(
        {"name": "echo", "handler": "hello.handler", "codePath": "."}), expect=(201,), user=(403,),
        check=lambda b: b["function"]["tenant"] == "acme"),
    "admin-replace-b-in-list": Probe("PUT", "/admin/v1/functions", data=yaml.safe_dump(
        [{"name": "echo", "handler": "hello.handler", "codePath": ".", "tenant": "default"}]), user=(403,)),
    # -- openYuanrong's function registration (B's `echo` is `0@default@echo`)
    "yr-get": Probe("GET", "/serverless/v1/functions/0@default@echo", user=(403,)),
    "yr-get-urn": Probe("GET", "/serverless/v1/functions/sn:cn:yrk:default:function:0@default@echo:latest",
                        user=(403,)),
    "yr-update": Probe("PUT", "/serverless/v1/functions/0@default@echo", json={
        "name": "0@default@echo", "handler": "hello.handler", "codePath": ".", "runtime": "python3.9"}, user=(403,)),
    "yr-delete": Probe("DELETE", "/serverless/v1/functions/0@default@echo", user=(403,)),
    "yr-register-same-name": Probe("POST", "/serverless/v1/functions", json={
        "name": "0@default@echo", "handler": "hello.handler", "codePath": ".", "runtime": "python3.9"},
        expect=(200,), user=(403,), check=lambda b: "acme" in b["function"]["id"]),
    # ... and the same by yrcli's path (openYuanrong's frontend forwards /admin/v1/functions there)
    "yr-admin-get": Probe("GET", "/admin/v1/functions/0@default@echo?versionNumber=latest", user=(403,)),
    "yr-admin-update": Probe("PUT", "/admin/v1/functions/0@default@echo", json={
        "name": "0@default@echo", "handler": "hello.handler", "codePath": ".", "runtime": "python3.9"}, user=(403,)),
    "yr-admin-delete": Probe("DELETE", "/admin/v1/functions/0@default@echo", user=(403,)),
    "yr-admin-register-same-name": Probe("POST", "/admin/v1/functions", json={
        "name": "0@default@echo", "handler": "hello.handler", "codePath": ".", "runtime": "python3.9"},
        expect=(200,), user=(403,), check=lambda b: "acme" in b["function"]["id"]),
    "admin-list": Probe("GET", "/admin/v1/functions", expect=(200,), user=(403,),
                        check=lambda body: _names("functions")(body) and "@echo" not in json.dumps(body["result"])),
    "yr-list": Probe("GET", "/serverless/v1/functions", expect=(200,), user=(403,),
                     check=lambda body: "@echo" not in json.dumps(body["result"])),
    # -- named streams (names are per tenant: A's `b-stream` is A's own, empty one)
    "stream-stat": Probe("GET", "/serverless/v1/streams?stream=b-stream", expect=(404,), user=(403,)),
    "stream-list": Probe("GET", "/serverless/v1/streams", expect=(200,), user=(403,),
                         check=lambda b: b["streams"] == []),
    "stream-delete": Probe("DELETE", "/serverless/v1/streams/b-stream", expect=(404,), user=(403,)),
    "stream-subscribe-path": Probe("GET", "/serverless/v1/streams/b-stream?from_id=0&timeout_ms=100",
                                   expect=(200,), user=(403,)),
    "stream-subscribe-header": Probe("GET", "/serverless/v1/stream/subscribe?from_id=0&timeout_ms=100",
                                     headers={"X-Stream-Name": "b-stream"}, expect=(200,), user=(403,)),
    "stream-publish": Probe("POST", "/serverless/v1/streams/b-stream", json=["from-a"], expect=(200,),
                            user=(403,), check=lambda b: b["ids"] == [1]),
    "stream-name-b-tenant": Probe("GET", "/serverless/v1/streams", headers={"X-Tenant-ID": "default"},
                                  expect=(403,)),
    "stream-subscribe-b-tenant": Probe("GET", "/serverless/v1/streams/b-stream?from_id=0&timeout_ms=100",
                                       headers={"X-Tenant-ID": "default"}, expect=(403,)),
}


@pytest.mark.parametrize("token", ["dev-a", "user-a"])
@pytest.mark.parametrize("name", list(PROBES))
async def test_tenant_a_cannot_reach_tenant_bs_things(make_client, name: str, token: str) -> None:
    probe = PROBES[name]
    client = await make_client(make_config(**{"auth.tokens": TOKENS}))
    world: World = await plant(client)
    before = await snapshot(client, world)
    path = probe.path.format(rp=world.runpod_job, yr=world.async_job, iv=world.invocation)
    resp = await client.request(probe.method, path, json=probe.json, data=probe.data,
                                headers={**bearer(token), **probe.headers})
    text = await resp.text()
    expect = probe.user if token == "user-a" and probe.user is not None else probe.expect
    assert resp.status in expect, (name, resp.status, text)
    # Nothing of B's in what A is shown (a job id A sent itself may be echoed in the 404).
    for secret in (SECRET, *(job for job in (world.runpod_job, world.async_job) if job not in path)):
        assert secret not in text, (name, secret, text)
    if resp.status in (200, 201) and probe.check is not None and "json" in resp.content_type:
        assert probe.check(json.loads(text)), (name, text)
    assert await snapshot(client, world) == before, name       # B's jobs, function, stream, queue unchanged
    assert await session_alive(client), name                   # and its session still open


# Routes that name nothing a tenant owns: liveness, the API document, the console's static files;
# /metrics has its own tenant test (tests/frontend/test_metrics.py) and /cluster/v1/status its own
# in cluster mode (tests/runtime/cluster/test_cluster_tenants.py).
NOT_PROBED = {("GET", "/healthz"), ("GET", "/openapi.json"), ("GET", "/"), ("GET", "/console"),
              ("GET", "/console/{path}"), ("GET", "/metrics"), ("GET", "/cluster/v1/status")}


def test_every_documented_route_is_probed() -> None:
    """A route added to frontend/api_table.py without a probe here fails this test."""
    import re

    import frontend.api_table  # noqa: F401  (fills OPERATIONS)
    from frontend.openapi import OPERATIONS

    def covers(method: str, template: str) -> bool:
        pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/?]+", re.escape(template)) + r"(\?.*)?$")
        return any(p.method == method and pattern.match(p.path.format(rp="J", yr="J", iv="J")) for p in PROBES.values())

    missing = {key for key in OPERATIONS if key not in NOT_PROBED and not covers(*key)}
    assert not missing, f"routes without a tenant probe: {sorted(missing)}"


# Every verb on B's function, by A: the answer is byte for byte the one for a name nobody deployed
# (the same request once B has deleted `echo`), so A learns nothing of B's names.
SAME_TRACE = {"X-Trace-Id": "0af7651916cd43dd8448eb211c80319c"}  # the body names the request's trace
UNKNOWN_ALIKE = ["admin-get", "admin-redeploy", "admin-delete", "invoke-json", "invoke-sse", "invoke-urn-path",
                 "invoke-async", "invoke-in-b-session", "session-interrupt", "session-end", "job-list-by-fn",
                 "runpod-run", "runpod-runsync", "runpod-status", "runpod-stream", "runpod-cancel", "runpod-retry",
                 "runpod-purge-queue", "runpod-health", "yr-get", "yr-get-urn", "yr-update", "yr-delete",
                 "yr-admin-get", "yr-admin-update", "yr-admin-delete"]


@pytest.mark.parametrize("token", ["dev-a", "user-a"])
async def test_another_tenants_function_answers_as_an_unknown_name(make_client, token: str) -> None:
    client = await make_client(make_config(**{"auth.tokens": TOKENS}))
    world: World = await plant(client)

    async def answers() -> dict[str, tuple[int, bytes]]:
        got = {}
        for name in UNKNOWN_ALIKE:
            probe = PROBES[name]
            if token == "user-a" and probe.user is not None:
                continue  # a route the role lacks: 403 before any name is looked up
            resp = await client.request(probe.method, probe.path.format(rp=world.runpod_job, yr=world.async_job),
                                        json=probe.json, data=probe.data,
                                        headers={**bearer(token), **probe.headers, **SAME_TRACE})
            got[name] = (resp.status, await resp.read())
        return got

    foreign = await answers()
    assert all(status in (200, 404) for status, _body in foreign.values()), foreign
    assert (await client.delete("/admin/v1/functions/echo", headers=bearer("dev-b"))).status == 200
    assert await answers() == foreign
