"""Tenants are a security boundary: functions and named streams of one tenant are out of reach of
another tenant's tokens (only `admin` manages across tenants); bearer parsing is exact."""
from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from frontend.client import iter_sse
from tests.support.servers import fn, make_config, test_config

TOKENS = [{"token": "dev-default", "tenant": "default", "role": "developer"},
          {"token": "user-default", "tenant": "default", "role": "user"},
          {"token": "dev-acme", "tenant": "acme", "role": "developer"},
          {"token": "user-acme", "tenant": "acme", "role": "user"},
          {"token": "root", "tenant": "ops", "role": "admin"}]
FUNCS = "/admin/v1/functions"
STREAMS = "/serverless/v1/streams"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def manifest(name: str, **fields: object) -> str:
    return yaml.safe_dump({"name": name, "handler": "echo.handler", "codePath": ".", **fields})


@pytest.fixture
async def tclient(make_client):
    return await make_client(make_config(**{"auth.tokens": TOKENS}))


async def test_developer_cannot_touch_another_tenants_functions(tclient):
    acme = bearer("dev-acme")
    for method, body in (("GET", None), ("PUT", manifest("echo")), ("DELETE", None)):
        resp = await tclient.request(method, f"{FUNCS}/echo", data=body, headers=acme)
        assert resp.status == 404, (method, await resp.text())  # another tenant's: an unknown name
        msg = (await resp.json())["message"]
        assert msg == "function 'echo' is not deployed" and "default" not in msg
    # echo (tenant default) is untouched and still answers its own tenant
    resp = await tclient.post("/serverless/v1/functions/echo/invocations", json={"a": 1},
                              headers=bearer("user-default"))
    assert resp.status == 200 and await resp.json() == {"a": 1}
    # deploying into another tenant is refused; nothing was deployed
    resp = await tclient.post(FUNCS, data=manifest("planted", tenant="default"), headers=acme)
    assert resp.status == 403
    assert (await tclient.get(f"{FUNCS}/planted", headers=bearer("dev-default"))).status == 404
    # the list shows only the token's own tenant
    listed = await (await tclient.get(FUNCS, headers=acme)).json()
    assert listed["functions"] == []


async def test_a_manifest_without_tenant_lands_in_the_tokens_tenant(tclient):
    resp = await tclient.post(FUNCS, data=manifest("acme-echo"), headers=bearer("dev-acme"))
    assert resp.status == 201, await resp.text()
    assert (await resp.json())["function"]["tenant"] == "acme"
    listed = await (await tclient.get(FUNCS, headers=bearer("dev-acme"))).json()
    assert [f["name"] for f in listed["functions"]] == ["acme-echo"]
    invoke = "/serverless/v1/functions/acme-echo/invocations"
    assert (await tclient.post(invoke, json={}, headers=bearer("user-acme"))).status == 200
    assert (await tclient.post(invoke, json={}, headers=bearer("user-default"))).status == 404
    assert (await tclient.get(f"{FUNCS}/acme-echo", headers=bearer("dev-default"))).status == 404
    assert (await tclient.delete(f"{FUNCS}/acme-echo", headers=bearer("dev-default"))).status == 404
    assert (await tclient.delete(f"{FUNCS}/acme-echo", headers=bearer("dev-acme"))).status == 200


async def test_admin_role_manages_every_tenant(tclient):
    root = bearer("root")
    listed = await (await tclient.get(FUNCS, headers=root)).json()
    assert "echo" in [f["name"] for f in listed["functions"]]
    resp = await tclient.post(FUNCS, data=manifest("for-acme", tenant="acme"), headers=root)
    assert resp.status == 201 and (await resp.json())["function"]["tenant"] == "acme"
    assert (await tclient.get(f"{FUNCS}/for-acme", headers=bearer("dev-acme"))).status == 200
    resp = await tclient.put(f"{FUNCS}/for-acme", data=manifest("for-acme", tenant="acme"), headers=root)
    assert resp.status == 200
    # names are per tenant: a bare name is the admin's own tenant's; X-Tenant-ID or a URN picks another
    assert (await tclient.get(f"{FUNCS}/for-acme", headers=root)).status == 404
    urn = (await (await tclient.get(f"{FUNCS}/for-acme", headers={**root, "X-Tenant-ID": "acme"})).json())[
        "function"]["urn"]
    assert (await tclient.get(f"{FUNCS}/{urn}", headers=root)).status == 200
    assert (await tclient.get(f"{FUNCS}/{urn}", headers=bearer("dev-default"))).status == 404
    assert (await tclient.delete(f"{FUNCS}/for-acme", headers={**root, "X-Tenant-ID": "acme"})).status == 200
    # admin does not run other tenants' code: invoking stays within the token's tenant
    resp = await tclient.post("/serverless/v1/functions/echo/invocations", json={}, headers=root)
    assert resp.status == 404


async def test_bearer_scheme_is_case_insensitive_and_tokens_exact(tclient):
    invoke = "/serverless/v1/functions/echo/invocations"
    for header in ("bearer user-default", "BEARER user-default", "Bearer user-default"):
        assert (await tclient.post(invoke, json={}, headers={"Authorization": header})).status == 200, header
    for header in ("Bearer  user-default", "Bearer user-default\t x", "Bearer user-defaul", "Bearer "):
        resp = await tclient.post(invoke, json={}, headers={"Authorization": header})
        assert resp.status == 401, header
        assert (await resp.json())["code"] == 200401
    assert (await tclient.get(f"{FUNCS}?token=%20dev-default")).status == 401


def test_config_refuses_whitespace_in_tokens():
    from runtime.errors import ConfigError
    with pytest.raises(ConfigError, match=r"auth\.tokens"):
        make_config(**{"auth.tokens": [{"token": "has space", "role": "user"}]})


async def test_named_streams_are_per_tenant_over_rest(tclient):
    acme, default = bearer("dev-acme"), bearer("dev-default")
    resp = await tclient.post(f"{STREAMS}/jobs?retain_num=10", json=["secret-1", "secret-2"], headers=acme)
    assert resp.status == 200 and (await resp.json())["stream"] == "jobs"
    # another tenant does not see it listed, cannot stat, read retained data, or delete it
    assert (await (await tclient.get(STREAMS, headers=default)).json())["streams"] == []
    assert (await tclient.get(f"{STREAMS}?stream=jobs", headers=default)).status == 404
    assert (await tclient.delete(f"{STREAMS}/jobs", headers=default)).status == 404
    sub = await tclient.get(f"{STREAMS}/jobs?from_id=0&timeout_ms=200", headers=default)
    body = (await sub.read()).decode()
    assert "secret" not in body and "idle_timeout" in body
    # its own publish goes to its own stream named `jobs`, ids from 1
    resp = await tclient.post(f"{STREAMS}/jobs", json=["mine"], headers=default)
    assert (await resp.json())["ids"] == [1]
    listed = (await (await tclient.get(STREAMS, headers=acme)).json())["streams"]
    assert [(s["name"], s["produced"]) for s in listed] == [("jobs", 2)]
    # a developer cannot pick another tenant; an admin can
    assert (await tclient.get(STREAMS, headers={**default, "X-Tenant-ID": "acme"})).status == 403
    assert (await tclient.get(STREAMS, headers={**bearer("root"), "X-Tenant-ID": "acme/x"})).status == 400
    resp = await tclient.get(f"{STREAMS}?stream=jobs", headers={**bearer("root"), "X-Tenant-ID": "acme"})
    assert resp.status == 200 and (await resp.json())["streams"][0]["retained"] == 2
    sub = await tclient.get(f"{STREAMS}/jobs?from_id=0&expect_num=2", headers=acme)
    assert [e["data"] async for e in iter_sse(sub)][:2] == ["secret-1", "secret-2"]


@pytest.mark.parametrize("executor", ["thread", "process"])
async def test_handler_streams_are_the_functions_tenant(tclient, executor):
    """A function of tenant acme produces into `shared`: acme reads it, default does not (thread and
    process executors: the process bridge qualifies names itself)."""
    spec = {"name": "acme-producer", "handler": "stream_producer.handler", "codePath": ".", "executor": executor}
    resp = await tclient.post(FUNCS, data=yaml.safe_dump(spec), headers=bearer("dev-acme"))
    assert resp.status == 201, await resp.text()
    event = {"stream": "shared", "count": 3, "retain_num": 10}
    resp = await tclient.post("/serverless/v1/functions/acme-producer/invocations", json=event,
                              headers=bearer("user-acme"))
    assert resp.status == 200, await resp.text()
    default_sub = await tclient.get(f"{STREAMS}/shared?from_id=0&timeout_ms=200", headers=bearer("dev-default"))
    assert "seq" not in (await default_sub.read()).decode()
    acme_sub = await tclient.get(f"{STREAMS}/shared?from_id=0", headers=bearer("dev-acme"))
    events = [e async for e in iter_sse(acme_sub)]
    assert [json.loads(e["data"])["seq"] for e in events[:-1]] == [1, 2, 3] and events[-1]["data"] == "[DONE]"
    # the bundled stream-producer (tenant default) keeps working for its tenant
    sub = await tclient.get(f"{STREAMS}/demo", headers=bearer("dev-default"))
    resp = await tclient.post("/serverless/v1/functions/stream-producer/invocations",
                              json={"stream": "demo", "count": 2}, headers=bearer("user-default"))
    assert resp.status == 200
    assert [e["data"] async for e in iter_sse(sub)][-1] == "[DONE]"
    await tclient.delete(f"{FUNCS}/acme-producer", headers=bearer("dev-acme"))


def _unqualified(text: str) -> bool:
    """No tenant-qualified broker name (`acme/orders`) in what a user is shown."""
    return "acme/" not in text and "orders" in text


async def test_rest_answers_and_events_show_only_the_callers_stream_name(tclient):
    acme = bearer("dev-acme")
    assert (await tclient.post(f"{STREAMS}/orders?retain_num=5", json=["a"], headers=acme)).status == 200
    for method, path in (("GET", f"{STREAMS}/orders?from_id=99"), ("GET", f"{STREAMS}?stream=orders-x"),
                         ("DELETE", f"{STREAMS}/orders-x")):
        resp = await tclient.request(method, path, headers=acme)
        assert resp.status in (400, 404), (path, await resp.text())
        assert _unqualified(await resp.text()), await resp.text()
    live = await tclient.get(f"{STREAMS}/orders", headers=acme)  # subscribed: live only
    assert (await tclient.delete(f"{STREAMS}/orders", headers=acme)).status == 200
    events = [e async for e in iter_sse(live)]
    assert events[-1]["event"] == "error" and _unqualified(events[-1]["data"]), events


@pytest.mark.parametrize("executor", ["thread", "process"])
async def test_the_handler_api_shows_only_the_functions_own_stream_name(make_client, executor):
    client = await make_client(test_config(**{"auth.tokens": TOKENS}))
    spec = fn("namer", "stream_names.shown_names", executor=executor)
    resp = await client.post(FUNCS, data=yaml.safe_dump(spec), headers=bearer("dev-acme"))
    assert resp.status == 201, await resp.text()
    resp = await client.post("/serverless/v1/functions/namer/invocations", json={"stream": "orders"},
                             headers=bearer("user-acme"))
    seen = await resp.json()
    assert resp.status == 200, seen
    assert seen["producer"] == seen["consumer"] == "orders"
    assert set(seen) == {"producer", "consumer", "bad_id", "deleted", "closed"}, seen
    assert all(_unqualified(seen[k]) for k in ("bad_id", "deleted", "closed")), seen


# -- names belong to their tenant ---------------------------------------------------------------
INVOKE_FC = "/serverless/v1/functions/fc/invocations"
SSE_ACCEPT = {"Accept": "text/event-stream"}


def fc(handler: str, **fields: object) -> dict:
    """`fc` of one tenant: acme's echoes (echo.handler), default's answers "ok" (hello.handler)."""
    return {"name": "fc", "handler": handler, "codePath": ".", **fields}


async def _invokes_own_fc(client, acme_token: str = "user-acme", default_token: str = "user-default") -> None:
    """Each tenant's `fc` answers its own tenant, in JSON and in SSE."""
    resp = await client.post(INVOKE_FC, json={"who": "acme"}, headers=bearer(acme_token))
    assert resp.status == 200 and await resp.json() == {"who": "acme"}, await resp.text()
    resp = await client.post(INVOKE_FC, json={"who": "default"}, headers=bearer(default_token))
    assert resp.status == 200 and await resp.json() == "ok", await resp.text()
    resp = await client.post(INVOKE_FC, json={"who": "acme"}, headers={**bearer(acme_token), **SSE_ACCEPT})
    events = [e["data"] async for e in iter_sse(resp)]
    assert json.loads(events[0]) == {"who": "acme"} and events[1:] == ["[DONE]"], events
    resp = await client.post(INVOKE_FC, json={}, headers={**bearer(default_token), **SSE_ACCEPT})
    assert [e["data"] async for e in iter_sse(resp)] == ['{"event": "this is a stream"}', '"ok"', "[DONE]"]


async def test_two_tenants_each_deploy_and_run_their_own_function_of_one_name(tclient):
    resp = await tclient.post(FUNCS, data=yaml.safe_dump(fc("echo.handler")), headers=bearer("dev-acme"))
    assert resp.status == 201, await resp.text()
    resp = await tclient.post(FUNCS, data=yaml.safe_dump(fc("hello.handler")), headers=bearer("dev-default"))
    assert resp.status == 201, await resp.text()  # not a 409: acme's `fc` is acme's
    resp = await tclient.put(FUNCS, data=yaml.safe_dump([fc("hello.handler")]), headers=bearer("dev-default"))
    assert resp.status == 200, await resp.text()  # not a 403: the list form redeploys default's own
    resp = await tclient.put(f"{FUNCS}/fc", data=yaml.safe_dump(fc("echo.handler", description="v2")),
                             headers=bearer("dev-acme"))
    assert resp.status == 200 and (await resp.json())["function"]["tenant"] == "acme", await resp.text()
    await _invokes_own_fc(tclient)
    for token, tenant in (("dev-acme", "acme"), ("dev-default", "default")):  # each lists only its own
        listed = (await (await tclient.get(FUNCS, headers=bearer(token))).json())["functions"]
        assert [(f["name"], f["tenant"]) for f in listed if f["name"] == "fc"] == [("fc", tenant)]
        assert all(f["tenant"] == tenant for f in listed)
    shown = (await (await tclient.get(f"{FUNCS}/fc", headers=bearer("dev-acme"))).json())["function"]
    assert shown["tenant"] == "acme" and shown["description"] == "v2"
    admin = (await (await tclient.get(FUNCS, headers=bearer("root"))).json())["functions"]
    assert sorted(f["tenant"] for f in admin if f["name"] == "fc") == ["acme", "default"]
    # a function's key (`acme/fc`) is no name: it reaches nothing of another tenant
    for ref in ("acme%2Ffc", "acme/fc"):
        resp = await tclient.post(f"/serverless/v1/functions/{ref}/invocations", json={},
                                  headers=bearer("user-default"))
        assert resp.status == 404, (ref, await resp.text())
        resp = await tclient.get(f"{FUNCS}/{ref}", headers=bearer("dev-default"))
        assert resp.status == 404, (ref, await resp.text())
    # deleting one tenant's leaves the other's
    assert (await tclient.delete(f"{FUNCS}/fc", headers=bearer("dev-acme"))).status == 200
    assert (await tclient.post(INVOKE_FC, json={}, headers=bearer("user-acme"))).status == 404
    resp = await tclient.post(INVOKE_FC, json={}, headers=bearer("user-default"))
    assert resp.status == 200 and await resp.json() == "ok"


async def test_two_tenants_functions_of_one_name_survive_a_restart(start_server, tmp_path):
    import aiohttp

    args = ("-s", f"jobs.path={tmp_path / 'jobs.sqlite3'}", "-s", f"auth.tokens={json.dumps(TOKENS)}")
    server = start_server(*args)
    async with aiohttp.ClientSession(base_url=server.url) as s:
        async with s.post(FUNCS, data=yaml.safe_dump(fc("echo.handler")), headers=bearer("dev-acme")) as r:
            assert r.status == 201, await r.text()
        async with s.put(FUNCS, data=yaml.safe_dump([fc("hello.handler")]), headers=bearer("dev-default")) as r:
            assert r.status == 200, await r.text()
    server.kill()  # SIGKILL: both were stored before they were answered
    server = start_server(*args)
    async with aiohttp.ClientSession(base_url=server.url) as s:
        await _invokes_own_fc(s)  # (a session's `await s.post(...)` is the test client's form)
        async with s.delete(f"{FUNCS}/fc", headers=bearer("dev-default")) as r:
            assert r.status == 200, await r.text()
    server.kill()
    server = start_server(*args)
    async with aiohttp.ClientSession(base_url=server.url) as s:
        async with s.post(INVOKE_FC, json={"a": 1}, headers=bearer("user-acme")) as r:
            assert r.status == 200 and await r.json() == {"a": 1}  # acme's stayed
        async with s.post(INVOKE_FC, json={}, headers=bearer("user-default")) as r:
            assert r.status == 404  # default's delete was stored too


async def test_a_store_of_bare_names_still_loads_and_is_rekeyed(make_client, tmp_path):
    """A deployment stored before names were per tenant (keyed by its bare name) comes back for
    its own tenant, and is re-keyed so another tenant's function of that name is a record of its own."""
    from runtime.jobs.store import SqliteJobStore
    from tests.support.servers import FUNCTIONS

    path = tmp_path / "jobs.sqlite3"
    old = SqliteJobStore(path)
    await old.open()
    spec = {**fc("echo.handler", tenant="acme"), "codePath": str(FUNCTIONS)}
    await old.save_function("fc", spec)
    await old.close()
    client = await make_client(make_config(**{"auth.tokens": TOKENS, "jobs.path": str(path)}))
    resp = await client.post(INVOKE_FC, json={"a": 1}, headers=bearer("user-acme"))
    assert resp.status == 200 and await resp.json() == {"a": 1}, await resp.text()
    assert (await client.post(INVOKE_FC, json={}, headers=bearer("user-default"))).status == 404
    resp = await client.post(FUNCS, data=yaml.safe_dump(fc("hello.handler")), headers=bearer("dev-default"))
    assert resp.status == 201, await resp.text()
    await client.close()
    store = SqliteJobStore(path)
    await store.open()
    try:
        assert sorted(key for key, _spec in await store.load_functions()) == ["acme/fc", "fc"]
    finally:
        await store.close()


async def test_with_auth_off_bare_names_work_as_before(make_client):
    """No tokens, no boundary: a bare name is the default tenant's function, else the only one's;
    `X-Tenant-ID` picks a tenant on the admin routes."""
    client = await make_client(make_config())
    resp = await client.post(FUNCS, data=yaml.safe_dump(fc("echo.handler", tenant="acme")))
    assert resp.status == 201, await resp.text()
    resp = await client.post(INVOKE_FC, json={"a": 1})
    assert resp.status == 200 and await resp.json() == {"a": 1}  # the only `fc`: acme's
    assert (await client.get(f"{FUNCS}/fc")).status == 200
    resp = await client.post(FUNCS, data=yaml.safe_dump(fc("hello.handler")))
    assert resp.status == 201, await resp.text()  # the default tenant's own `fc`
    resp = await client.post(INVOKE_FC, json={})
    assert resp.status == 200 and await resp.json() == "ok"  # a bare name: the default tenant's
    resp = await client.post("/invocations/acme/default/fc/", json={"b": 2})
    assert resp.status == 200 and await resp.json() == {"b": 2}  # the short route names the tenant
    acme = {"X-Tenant-ID": "acme"}
    assert (await (await client.get(f"{FUNCS}/fc", headers=acme)).json())["function"]["tenant"] == "acme"
    listed = (await (await client.get(FUNCS, headers=acme)).json())["functions"]
    assert [f["tenant"] for f in listed] == ["acme"]
    assert (await client.delete(f"{FUNCS}/fc", headers=acme)).status == 200
    resp = await client.post(INVOKE_FC, json={})
    assert resp.status == 200 and await resp.json() == "ok"


# -- quotas (answered at deploy, nothing started) -----------------------------------------------
async def test_a_tenant_may_deploy_at_most_max_functions(make_client):
    client = await make_client(test_config(**{"auth.tokens": TOKENS, "tenants.maxFunctions": 2}))  # none deployed
    acme = bearer("dev-acme")
    resp = await client.put(FUNCS, data=yaml.safe_dump([fc("echo.handler"), {**fc("echo.handler"), "name": "fd"}]),
                            headers=acme)
    assert resp.status == 200, await resp.text()
    resp = await client.post(FUNCS, data=manifest("fe"), headers=acme)
    assert resp.status == 429, await resp.text()
    body = await resp.json()
    assert body["code"] == 200429 and "tenants.maxFunctions" in body["message"]
    assert (await client.get(f"{FUNCS}/fe", headers=acme)).status == 404  # nothing was deployed
    resp = await client.put(f"{FUNCS}/fc", data=yaml.safe_dump(fc("echo.handler", description="v2")), headers=acme)
    assert resp.status == 200, await resp.text()  # a redeploy is no new function
    default = bearer("dev-default")  # another tenant's count is its own
    assert (await client.post(FUNCS, data=manifest("fe"), headers=default)).status == 201
    assert (await client.post(FUNCS, data=manifest("fc"), headers=default)).status == 201
    assert (await client.post(FUNCS, data=manifest("ff"), headers=default)).status == 429
    assert (await client.delete(f"{FUNCS}/fd", headers=acme)).status == 200
    assert (await client.post(FUNCS, data=manifest("fe"), headers=acme)).status == 201


async def test_process_instances_are_capped_per_function_and_per_node(make_client):
    config = test_config(**{"tenants.maxInstancesPerFunction": 4, "runtime.maxWorkerProcesses": 3})
    client = await make_client(config)
    spec = {"name": "pw", "handler": "echo.handler", "codePath": ".", "executor": "process"}
    for fields in ({"minInstances": 5}, {"maxInstances": 256}, {"instances": 5}):
        resp = await client.post(FUNCS, data=yaml.safe_dump({**spec, **fields}))
        assert resp.status == 400 and "tenants.maxInstancesPerFunction" in (await resp.json())["message"], fields
    resp = await client.post(FUNCS, data=yaml.safe_dump({**spec, "minInstances": 2, "maxInstances": 4}))
    assert resp.status == 201, await resp.text()
    resp = await client.post(FUNCS, data=yaml.safe_dump({**spec, "name": "pw2", "instances": 2}))
    assert resp.status == 429 and "runtime.maxWorkerProcesses" in (await resp.json())["message"]
    assert (await client.get(f"{FUNCS}/pw2")).status == 404  # refused before a worker was started
    resp = await client.post(FUNCS, data=yaml.safe_dump({**spec, "name": "pw2", "minInstances": 0}))
    assert resp.status == 201, await resp.text()  # scale-to-zero holds one, for its cold start


async def test_scaling_out_under_load_stops_at_the_nodes_worker_limit(make_client):
    # Two functions that may each scale to 3 workers, on a node of 3: loaded at once, they share
    # the 3 (the deploy quota counts what they keep; this counts what they scale out to).
    from tests.support.servers import ROOT
    config = test_config(**{"runtime.maxWorkerProcesses": 3,
                            "runtime.codeRoots": [str(ROOT / "tests" / "process_functions")]})
    client = await make_client(config)
    for name in ("sa", "sb"):
        spec = {"name": name, "handler": "shared.chunked_sleep", "codePath": str(ROOT / "tests" / "process_functions"),
                "executor": "process", "minInstances": 1, "maxInstances": 3, "instanceConcurrency": 1,
                "timeout": 30}
        resp = await client.post(FUNCS, data=yaml.safe_dump(spec))
        assert resp.status == 201, await resp.text()

    async def workers() -> int:
        total = 0
        for name in ("sa", "sb"):
            body = await (await client.get(f"{FUNCS}/{name}")).json()
            total += len(body["function"]["status"]["pool"]["workers"])
        return total

    calls = [asyncio.ensure_future(client.post(f"/serverless/v1/functions/{name}/invocations",
                                               json={"seconds": 1.5}))
             for name in ("sa", "sb", "sa", "sb", "sa", "sb")]
    peak = 0
    while not all(c.done() for c in calls):
        peak = max(peak, await workers())
        await asyncio.sleep(0.05)
    assert all(c.result().status == 200 for c in calls)  # the rest waited for a slot, then ran
    assert peak == 3, peak  # scaled out to the node's limit, and no further
