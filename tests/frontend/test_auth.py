"""Token auth: roles, tenants, constant-time comparison is used, /healthz stays open."""
from tests.support.servers import make_config

TOKENS = [{"token": "dev-token", "tenant": "default", "role": "developer"},
          {"token": "user-token", "tenant": "default", "role": "user"},
          {"token": "other-tenant", "tenant": "acme", "role": "user"}]


async def test_auth_roles(make_client):
    client = await make_client(make_config(**{"auth.tokens": TOKENS}))
    invoke = "/serverless/v1/functions/echo/invocations"
    assert (await client.get("/healthz")).status == 200
    resp = await client.post(invoke, json={})
    assert resp.status == 401 and "Bearer" in (await resp.json())["message"]
    resp = await client.post(invoke, json={}, headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401 and (await resp.json())["message"] == "invalid token"
    for token in ("user-token", "dev-token"):
        resp = await client.post(invoke, json={"t": token}, headers={"Authorization": f"Bearer {token}"})
        assert resp.status == 200 and await resp.json() == {"t": token}
    resp = await client.post("/invocations/default/default/echo/", json={}, headers={"X-Auth": "user-token"})
    assert resp.status == 200
    # admin needs developer
    resp = await client.get("/admin/v1/functions", headers={"Authorization": "Bearer user-token"})
    assert resp.status == 403 and "developer" in (await resp.json())["message"]
    resp = await client.get("/admin/v1/functions", headers={"Authorization": "Bearer dev-token"})
    assert resp.status == 200
    resp = await client.get("/admin/v1/functions")
    assert resp.status == 401
    # a browser EventSource cannot send headers: GET may carry ?token=
    assert (await client.get("/admin/v1/functions?token=dev-token")).status == 200
    assert (await client.get("/admin/v1/functions?token=user-token")).status == 403
    assert (await client.post(invoke + "?token=user-token", json={})).status == 401  # GET only
    # a token of another tenant does not find this tenant's functions (names are per tenant)
    resp = await client.post(invoke, json={}, headers={"Authorization": "Bearer other-tenant"})
    assert resp.status == 404 and "tenant" not in (await resp.json())["message"]


async def test_auth_off_without_tokens(client):
    resp = await client.get("/admin/v1/functions")
    assert resp.status == 200
