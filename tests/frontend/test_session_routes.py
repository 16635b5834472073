"""Session routes (interrupt, end) take the tokens of invoking: either role of the function's tenant,
never another tenant's; the tenant check is dispatch's (Dispatcher.find)."""
import json

from tests.support.servers import make_config

TOKENS = [{"token": "dev-token", "tenant": "default", "role": "developer"},
          {"token": "user-token", "tenant": "default", "role": "user"},
          {"token": "other-tenant", "tenant": "acme", "role": "user"}]
SESSION = {"X-Instance-Session": json.dumps({"sessionID": "chat-1", "sessionTTL": 60})}
URL = "/serverless/v1/functions/echo/sessions/chat-1"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_session_routes_take_the_invoking_tokens_of_the_functions_tenant(make_client):
    client = await make_client(make_config(**{"auth.tokens": TOKENS}))
    resp = await client.post("/serverless/v1/functions/echo/invocations", json={"hi": 1},
                             headers=bearer("user-token") | SESSION)
    assert resp.status == 200 and await resp.json() == {"hi": 1}
    assert (await client.post(f"{URL}/interrupt")).status == 401
    resp = await client.post(f"{URL}/interrupt", headers=bearer("other-tenant"))
    # another tenant's function: the answer of a name nobody deployed, naming no tenant
    assert resp.status == 404 and (await resp.json())["message"] == "function 'echo' is not deployed"
    resp = await client.delete(URL, headers=bearer("other-tenant"))
    assert resp.status == 404
    resp = await client.post(f"{URL}/interrupt", headers=bearer("user-token"))
    assert resp.status == 200 and await resp.json() == {"code": 0, "message": "SUCCESS", "sessionID": "chat-1",
                                                        "interrupted": 0}
    resp = await client.delete(URL, headers=bearer("user-token"))
    assert resp.status == 200 and (await resp.json())["sessionID"] == "chat-1"
    resp = await client.delete(URL, headers=bearer("dev-token"))  # ended: gone
    assert resp.status == 404 and (await resp.json())["code"] == 200404
    resp = await client.delete("/serverless/v1/functions/nope/sessions/chat-1", headers=bearer("user-token"))
    assert resp.status == 404 and (await resp.json())["code"] == 150424  # unknown function, as invoking


async def test_a_malformed_session_header_is_refused_before_the_function_runs(client):
    resp = await client.post("/serverless/v1/functions/echo/invocations", json={},
                             headers={"X-Instance-Session": '{"sessionID": ""}'})
    body = await resp.json()
    assert resp.status == 400 and body["code"] == 200400 and "sessionID" in body["message"]
    resp = await client.get("/admin/v1/functions/echo")
    assert (await resp.json())["function"]["status"]["sessions"] == []


async def test_a_session_header_nested_deep_is_a_400_not_a_500(client):
    deep = '{"sessionID": ' + "[" * 3000 + "]" * 3000 + "}"
    resp = await client.post("/serverless/v1/functions/echo/invocations", json={},
                             headers={"X-Instance-Session": deep})
    body = await resp.json()
    assert resp.status == 400 and body["code"] == 200400 and "X-Instance-Session" in body["message"]


async def test_a_session_header_on_a_background_job_is_refused_not_ignored(client):
    session = {"X-Instance-Session": json.dumps({"sessionID": "s1"})}
    resp = await client.post("/serverless/v1/functions/echo/invocations", json={},
                             headers={**session, "X-Invoke-Type": "async"})
    assert resp.status == 400 and "X-Instance-Session" in (await resp.json())["message"]
    for route in ("run", "runsync"):
        resp = await client.post(f"/v2/echo/{route}", json={"input": {}}, headers=session)
        assert resp.status == 400, route
        assert "X-Instance-Session" in await resp.text()  # RunPod's error shape
    resp = await client.get("/serverless/v1/jobs")
    assert (await resp.json())["jobs"] == []  # nothing was queued
