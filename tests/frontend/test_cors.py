"""CORS (frontend.cors) and the Origin guard: preflights, headers on every answer, foreign pages refused."""
import pytest

from runtime.errors import ConfigError
from tests.support.servers import fn, test_config

PAGE = "http://page.example:8080"
EVIL = "http://evil.example"
INVOKE = "/serverless/v1/functions/record/invocations"


@pytest.fixture
async def cors_client(make_client, deploy_dir):
    async def factory(**overrides):
        deploy = deploy_dir(fn("record", "observed_fns.record"), fn("ticker", "testfns.sync_ticker"))
        cfg = test_config(deploy, **{"frontend.cors.allowOrigins": [PAGE], **overrides})
        return await make_client(config=cfg)
    return factory


def _preflight(method: str = "POST", headers: str = "content-type, authorization, x-stream-name") -> dict:
    return {"Origin": PAGE, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": headers}


@pytest.mark.parametrize("path,method", [
    (INVOKE, "POST"),
    ("/invocations/default/default/record/", "POST"),
    ("/admin/v1/functions", "POST"),
    ("/admin/v1/functions/record", "DELETE"),
    ("/serverless/v1/stream/subscribe", "GET"),
    ("/serverless/v1/streams/some-stream", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/metrics", "GET"),
])
async def test_preflight_answers_204_on_every_route(cors_client, path, method):
    client = await cors_client()
    resp = await client.options(path, headers=_preflight(method))
    assert resp.status == 204, await resp.text()
    assert resp.headers["Access-Control-Allow-Origin"] == PAGE
    assert "Origin" in resp.headers["Vary"]
    assert method in resp.headers["Access-Control-Allow-Methods"].split(", ")
    allowed = {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
    for header in ("authorization", "content-type", "accept", "last-event-id", "x-auth", "x-trace-id",
                   "x-invoke-type", "x-instance-session", "x-stream-name"):
        assert header in allowed
    assert resp.headers["Access-Control-Max-Age"] == "600"


async def test_preflight_of_an_unknown_route_is_404(cors_client):
    client = await cors_client()
    resp = await client.options("/no/such/route", headers=_preflight())
    assert resp.status == 404


async def test_every_answer_to_an_allowed_origin_has_cors_headers(cors_client):
    tokens = [{"token": "dev", "role": "developer"}]
    client = await cors_client(**{"auth.tokens": tokens, "frontend.cors.exposeHeaders": ["X-Trace-Id"]})
    auth = {"Origin": PAGE, "Authorization": "Bearer dev"}
    answers = [
        await client.post(INVOKE, json={}, headers=auth),                                        # JSON
        await client.post("/serverless/v1/functions/ticker/invocations", json={"count": 2},
                          headers={**auth, "Accept": "text/event-stream"}),                       # SSE
        await client.post("/serverless/v1/functions/nope/invocations", json={}, headers=auth),   # 404
        await client.post(INVOKE, json={}, headers={"Origin": PAGE}),                            # 401
        await client.get("/healthz", headers={"Origin": PAGE}),
    ]
    assert [a.status for a in answers] == [200, 200, 404, 401, 200]
    for resp in answers:
        await resp.read()
        assert resp.headers["Access-Control-Allow-Origin"] == PAGE
        assert "Origin" in resp.headers["Vary"]
        assert "X-Request-Id" in resp.headers["Access-Control-Expose-Headers"]
        assert resp.headers["X-Request-Id"] == resp.headers["X-Trace-Id"]
    assert answers[1].headers["Content-Type"].startswith("text/event-stream")


async def test_foreign_origin_simple_post_never_runs_the_function(cors_client):
    client = await cors_client()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        resp = await client.post(INVOKE, data=b"{}", headers={"Origin": EVIL, "Content-Type": content_type})
        body = await resp.json()
        assert resp.status == 403 and body["code"] == 200403 and "not allowed" in body["message"]
        assert "Access-Control-Allow-Origin" not in resp.headers
    for path, method in (("/serverless/v1/streams/s1", "POST"), ("/admin/v1/functions", "GET"),
                         ("/admin/v1/functions/record", "DELETE"), ("/invocations/default/default/record/", "POST")):
        resp = await client.request(method, path, data=b'["x"]', headers={"Origin": EVIL})
        assert resp.status == 403, (path, await resp.text())
    resp = await client.get("/admin/v1/functions")  # nothing was deleted, nothing ran
    functions = (await resp.json())["functions"]
    assert [f["name"] for f in functions] == ["record", "ticker"]
    assert functions[0]["status"]["invocations"] == 0
    assert (await client.post(INVOKE, json={})).status == 200  # (the counter does count)
    resp = await client.get("/admin/v1/functions/record")
    assert (await resp.json())["function"]["status"]["invocations"] == 1


async def test_requests_without_origin_or_from_the_own_origin_keep_working(cors_client, make_client, deploy_dir):
    client = await cors_client()
    # curl -d sends form-urlencoded, as openYuanrong's docs invoke.
    resp = await client.post(INVOKE, data=b'{"a": 1}', headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 200
    own = f"http://{client.server.host}:{client.server.port}"
    resp = await client.post(INVOKE, data=b"{}", headers={"Origin": own, "Content-Type": "text/plain"})
    assert resp.status == 200
    # Behind a proxy that rewrites Host: the page's origin is the proxy's, named in X-Forwarded-Host,
    # believed from a frontend.trustedProxies peer only.
    forwarded = {"Origin": "https://fn.example.com", "X-Forwarded-Host": "fn.example.com"}
    assert (await client.post(INVOKE, json={}, headers=forwarded)).status == 403
    proxied = await cors_client(**{"frontend.trustedProxies": ["127.0.0.1"],
                                   "frontend.allowedHosts": ["fn.example.com", "127.0.0.1"]})
    assert (await proxied.post(INVOKE, json={}, headers=forwarded)).status == 200
    # CORS off (the default): the guard still refuses other origins, the own origin passes.
    off = await make_client(config=test_config(deploy_dir(fn("record", "observed_fns.record"))))
    own = f"http://{off.server.host}:{off.server.port}"
    assert (await off.post(INVOKE, json={}, headers={"Origin": own})).status == 200
    resp = await off.post(INVOKE, json={}, headers={"Origin": PAGE})
    assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers
    assert (await off.get("/healthz", headers={"Origin": PAGE})).status == 200  # reads are not guarded


async def test_wildcard_and_credentials(cors_client):
    client = await cors_client(**{"frontend.cors.allowOrigins": ["*"]})
    resp = await client.post(INVOKE, json={}, headers={"Origin": EVIL})
    assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in resp.headers
    client = await cors_client(**{"frontend.cors.allowCredentials": True})  # a listed origin, with credentials
    resp = await client.post(INVOKE, json={}, headers={"Origin": PAGE})
    assert resp.headers["Access-Control-Allow-Origin"] == PAGE
    assert resp.headers["Access-Control-Allow-Credentials"] == "true"


def test_wildcard_with_credentials_is_a_config_error():
    """Any origin, `null` included, with credentials: refused at start, naming both keys."""
    with pytest.raises(ConfigError) as err:
        test_config(**{"frontend.cors.allowOrigins": ["*"], "frontend.cors.allowCredentials": True})
    assert "frontend.cors.allowOrigins" in str(err.value) and "frontend.cors.allowCredentials" in str(err.value)


@pytest.mark.parametrize("origins", [["null"], ["https://a.example", "NULL"], ["https://a.example", "*"]])
def test_null_or_any_origin_with_credentials_is_a_config_error(origins):
    """`null` is any sandboxed frame or file:// page: with credentials as unsafe as `*`. The message
    quotes the list configured, not `['*']`."""
    with pytest.raises(ConfigError) as err:
        test_config(**{"frontend.cors.allowOrigins": origins, "frontend.cors.allowCredentials": True})
    assert str(origins) in str(err.value) and "\n" not in str(err.value)
    test_config(**{"frontend.cors.allowOrigins": origins})  # without credentials: allowed
