"""openYuanrong's function-registration API (`/serverless/v1/functions`) over loopback: its JSON
in, its answers out, the function invoked by its URN, with roles and tenants."""
from __future__ import annotations

import pytest

from tests.support.servers import make_config

FUNCS = "/serverless/v1/functions"
TOKENS = [{"token": "dev-default", "tenant": "default", "role": "developer"},
          {"token": "user-default", "tenant": "default", "role": "user"},
          {"token": "dev-acme", "tenant": "acme", "role": "developer"}]


def registration(name="0@faaspy@hello3", **fields):
    """openYuanrong's own request example, pointed at fnstream's shipped echo handler."""
    return {"name": name, "runtime": "python3.9", "description": "this is a function",
            "handler": "echo.handler", "kind": "faas", "cpu": 600, "memory": 512, "timeout": 600,
            "customResources": {}, "environment": {"GREETING": "hi"},
            "extendedHandler": {}, "extendedTimeout": {"initializer": 600, "pre_stop": 10},
            "minInstance": "0", "maxInstance": "10", "concurrentNum": "2", "storageType": "local",
            "codePath": ".", "s3CodePath": {}, "poolId": "pool1", **fields}


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


async def test_register_get_invoke_by_urn_update_delete(make_client):
    client = await make_client(make_config())
    resp = await client.post(FUNCS, json=registration())
    body = await resp.json()
    assert resp.status == 200, body
    assert body["code"] == 0 and body["message"] == "SUCCESS"
    urn = body["function"]["functionVersionUrn"]
    assert urn == "sn:cn:yrk:default:function:0@faaspy@hello3:latest" == body["function"]["id"]
    assert body["function"]["revisionId"] and body["function"]["concurrentNum"] == 2
    # invoked by its URN, as openYuanrong's clients do
    resp = await client.post(f"{FUNCS}/{urn}/invocations", json={"x": 1})
    assert resp.status == 200 and await resp.json() == {"x": 1}
    for ref in ("0@faaspy@hello3", urn):
        got = await (await client.get(f"{FUNCS}/{ref}")).json()
        assert got["code"] == 0 and got["function"]["name"] == "0@faaspy@hello3"
        assert got["function"]["handler"] == "echo.handler" and got["function"]["environment"] == {"GREETING": "hi"}
    # the same name again: openYuanrong's 4101
    resp = await client.post(FUNCS, json=registration())
    assert resp.status == 409 and (await resp.json())["code"] == 4101
    # update, as yrcli does it (the current revisionId sent back): a new revision with the new settings,
    # answered in `result` as openYuanrong's meta-service answers an update
    revision = body["function"]["revisionId"]
    resp = await client.put(f"{FUNCS}/0@faaspy@hello3",
                            json=registration(concurrentNum="3", timeout=30, revisionId=revision))
    answer = await resp.json()
    assert resp.status == 200 and answer["code"] == 0 and answer["message"] == "" and "function" not in answer
    updated = answer["result"]
    assert updated["concurrentNum"] == 3 and updated["timeout"] == 30 and updated["name"] == "0@faaspy@hello3"
    assert updated["revisionId"] != revision
    # the revision it replaced is stale now: openYuanrong's 4134
    resp = await client.put(f"{FUNCS}/0@faaspy@hello3", json=registration(revisionId=revision))
    assert resp.status == 409 and await resp.json() == {"code": 4134, "message": "revisionID is not the same",
                                                        "trace_id": resp.headers["X-Trace-Id"]}
    assert resp.headers["X-Inner-Code"] == "4134"
    # the admin API sees the same function (one deploy path)
    assert (await (await client.get("/admin/v1/functions/hello3")).json())["function"]["namespace"] == "faaspy"
    assert (await client.get(f"{FUNCS}/0@faaspy@hello3?versionNumber=latest")).status == 200  # as yrcli asks
    assert (await client.get(f"{FUNCS}/0@faaspy@hello3?versionNumber=v2")).status == 404
    resp = await client.delete(f"{FUNCS}/0@faaspy@hello3?versionNumber=latest")
    assert resp.status == 200 and await resp.json() == {}  # openYuanrong's delete answers {}
    for method in ("GET", "PUT", "DELETE"):  # gone: openYuanrong's 4115, naming the function
        resp = await client.request(method, f"{FUNCS}/0@faaspy@hello3", json=registration())
        gone = await resp.json()
        assert resp.status == 404 and gone["code"] == 4115, (method, gone)
        assert gone["message"] == "function [0@faaspy@hello3] is not found. check input parameters"


@pytest.mark.parametrize("fields, says", [
    ({"name": "hello3"}, "is not '0@{service}@{func}'"),
    ({"name": "0@a_b@hello"}, "is not '0@{service}@{func}'"),
    ({"name": "0@faaspy@hello-"}, "is not '0@{service}@{func}'"),  # openYuanrong's rule: not ending with '-'
    ({"name": "0-faaspy@hello"}, "is not '0@{service}@{func}'"),
    ({"name": "0@faaspy@1hello"}, "must start with a lowercase letter"),  # openYuanrong's, not a fnstream name
    ({"kind": "yrlib"}, "only 'faas'"),
    ({"storageType": "s3"}, "'storageType'"),
    ({"runtime": "posix-custom-runtime"}, "'runtime'"),
    ({"concurrentNum": "many"}, "'concurrentNum' must be a string of digits"),
    ({"handler": "nomodule.handler"}, "nomodule"),
    ({"codePath": "/etc"}, "outside the allowed code roots"),
])
async def test_bad_registrations_are_400_in_openyuanrongs_shape(make_client, fields, says):
    client = await make_client(make_config())
    resp = await client.post(FUNCS, json=registration(**fields))
    body = await resp.json()
    # openYuanrong's InvalidUserParam
    assert resp.status == 400 and body["code"] == 4104 and says in body["message"], body
    assert resp.headers["X-Inner-Code"] == "4104"
    assert (await client.get(f"{FUNCS}/0@faaspy@hello3")).status == 404


@pytest.mark.parametrize("method, path", [("POST", FUNCS), ("PUT", f"{FUNCS}/0@faaspy@hello3")])
async def test_a_body_that_is_not_json_is_openyuanrongs_130600(make_client, method, path):
    client = await make_client(make_config())
    assert (await client.post(FUNCS, json=registration())).status == 200
    resp = await client.request(method, path, data=b'{"name": "0@faaspy@hello3",',
                                headers={"Content-Type": "application/json"})
    body = await resp.json()
    assert resp.status == 400 and body["code"] == 130600 and "not valid JSON" in body["message"], body
    assert resp.headers["X-Inner-Code"] == "130600"


async def test_roles_and_tenants(make_client):
    client = await make_client(make_config(**{"auth.tokens": TOKENS}))
    resp = await client.post(FUNCS, json=registration(), headers=bearer("user-default"))
    assert resp.status == 403  # registering needs the developer role
    resp = await client.post(FUNCS, json=registration(), headers=bearer("dev-acme"))
    urn = (await resp.json())["function"]["functionVersionUrn"]
    assert resp.status == 200 and urn == "sn:cn:yrk:acme:function:0@faaspy@hello3:latest"  # the token's tenant
    for method, body in (("GET", None), ("PUT", registration()), ("DELETE", None)):
        resp = await client.request(method, f"{FUNCS}/0@faaspy@hello3", json=body, headers=bearer("dev-default"))
        assert resp.status in (403, 404), (method, await resp.text())  # another tenant's function
    resp = await client.get(f"{FUNCS}/{urn}", headers=bearer("dev-acme"))
    assert resp.status == 200 and (await resp.json())["function"]["tenantId"] == "acme"
    assert (await client.get("/openapi.json")).status == 200


async def test_list_is_the_callers_tenant_only_in_openyuanrongs_shape(make_client):
    client = await make_client(make_config(**{"auth.tokens": TOKENS}))
    for token, name in (("dev-default", "0@faaspy@hello3"), ("dev-default", "0@faaspy@other"),
                        ("dev-acme", "0@faaspy@secret"), ("dev-acme", "0@faaspy@hello3")):
        resp = await client.post(FUNCS, json=registration(name), headers=bearer(token))
        assert resp.status == 200, await resp.text()
    resp = await client.get(FUNCS, headers=bearer("dev-default"))  # the server's own functions too
    body = await resp.json()
    assert resp.status == 200 and body["code"] == 0 and body["message"] == "", body  # its WriteResponse
    listed = body["result"]["functions"]
    assert body["result"]["total"] == len(listed) and "0@faaspy@other" in [f["name"] for f in listed]
    assert {f["tenantId"] for f in listed} == {"default"} and "secret" not in await resp.text()
    acme = await (await client.get(FUNCS, headers=bearer("dev-acme"))).json()
    assert [f["name"] for f in acme["result"]["functions"]] == ["0@faaspy@hello3", "0@faaspy@secret"]
    assert acme["result"]["functions"][0]["functionVersionUrn"] == "sn:cn:yrk:acme:function:0@faaspy@hello3:latest"
    assert (await client.get(FUNCS, headers=bearer("user-default"))).status == 403  # managing needs a developer
    # openYuanrong's query: name matches part of the name, versionNumber exactly, pages from 1
    async def names(query):
        got = await (await client.get(f"{FUNCS}?{query}", headers=bearer("dev-default"))).json()
        return [f["name"] for f in got["result"]["functions"]], got["result"]["total"]
    assert await names("name=oth") == (["0@faaspy@other"], 1)
    assert await names("versionNumber=latest&name=@faaspy@") == (["0@faaspy@hello3", "0@faaspy@other"], 2)
    assert await names("versionNumber=v9") == ([], 0)
    assert await names("name=faaspy&pageIndex=2&pageSize=1") == (["0@faaspy@other"], 2)
    assert await names("name=faaspy&pageIndex=3&pageSize=1") == ([], 2)
    resp = await client.get(f"{FUNCS}?pageSize=0", headers=bearer("dev-default"))
    bad = await resp.json()
    assert resp.status == 400 and bad["code"] == 4123 and "pageSize" in bad["message"]  # PageInfoError
    spec = await (await client.get("/openapi.json")).json()
    assert "get" in spec["paths"]["/serverless/v1/functions"]


async def test_yrcli_deploy_update_invoke_delete_over_the_admin_path(make_client):
    """yrcli (openYuanrong runtime api/python/yr/cli/scripts.py) talks to `/admin/v1/functions`,
    which openYuanrong's frontend forwards to its meta-service: the same calls, bodies and reads."""
    client = await make_client(make_config(**{"auth.tokens": TOKENS}))
    admin = "/admin/v1/functions"
    headers = {"Content-Type": "application/json", "User-Agent": "DeploymentScript/1.0", "X-Auth": "dev-default"}

    async def call(method, path, body):  # HTTPClient.request: json=body, success is status 200 only
        resp = await client.request(method, path, json=body, headers=headers)
        return resp.status, await resp.json()
    # deploy: query_function (not found), then deploy_function reads data["function"]
    status, _ = await call("GET", f"{admin}/0@faaspy@hello3?versionNumber=latest", {})
    assert status == 404
    status, data = await call("POST", admin, registration())
    assert status == 200 and data["function"]["name"] == "0@faaspy@hello3", data
    # deploy --update: query_function reads data["function"]["revisionId"], update_function data["result"]
    status, data = await call("GET", f"{admin}/0@faaspy@hello3?versionNumber=latest", {})
    assert status == 200
    status, data = await call("PUT", f"{admin}/0@faaspy@hello3",
                              registration(concurrentNum="4", revisionId=data["function"]["revisionId"]))
    assert status == 200 and data["result"]["concurrentNum"] == 4, data
    # query (no name) reads data["result"]["functions"]
    status, data = await call("GET", admin, {})
    assert status == 200 and "0@faaspy@hello3" in [f["name"] for f in data["result"]["functions"]]
    assert "hello3" in [f["name"] for f in data["functions"]]  # fnstream's own list, as before
    # invoke_function: /invocations/{user}/{service}/{name}:{version}/
    resp = await client.post("/invocations/default/faaspy/hello3:latest/", json={"q": 1}, headers=headers)
    assert resp.status == 200 and await resp.json() == {"q": 1}
    status, data = await call("DELETE", f"{admin}/0@faaspy@hello3?versionNumber=latest", {})
    assert status == 200 and data == {}
    status, data = await call("GET", f"{admin}/0@faaspy@hello3?versionNumber=latest", {})
    assert status == 404 and data["code"] == 4115
    # a fnstream manifest posted there is fnstream's, as before
    resp = await client.post(admin, data="name: hello4\nhandler: echo.handler\n",
                             headers={"X-Auth": "dev-default"})
    assert resp.status == 201 and (await resp.json())["function"]["name"] == "hello4"


async def test_the_dash_form_of_the_name_is_the_same_function(make_client):
    """openYuanrong also names a function `0-{service}-{func}` (its funNameReg; yrcli offers it)."""
    client = await make_client(make_config())
    resp = await client.post("/admin/v1/functions", json=registration("0-faaspy-hello-3"))
    body = await resp.json()
    assert resp.status == 200 and body["function"]["name"] == "0@faaspy@hello-3", body
    for ref in ("0-faaspy-hello-3", "0@faaspy@hello-3"):
        assert (await client.get(f"{FUNCS}/{ref}")).status == 200
        assert (await client.get(f"/admin/v1/functions/{ref}")).status == 200
    resp = await client.put(f"{FUNCS}/0@faaspy@hello-3", json=registration("0-faaspy-hello-3", concurrentNum="5"))
    assert resp.status == 200 and (await resp.json())["result"]["concurrentNum"] == 5
    resp = await client.put(f"{FUNCS}/0@faaspy@hello-3", json=registration("0-other-hello-3"))
    assert resp.status == 400 and (await resp.json())["code"] == 4104  # not the function of the path
    assert (await client.delete("/admin/v1/functions/0-faaspy-hello-3")).status == 200
    assert (await client.get(f"{FUNCS}/0@faaspy@hello-3")).status == 404
