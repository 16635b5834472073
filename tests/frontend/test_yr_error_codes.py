"""docs/yr.md's error-code table, fnstream's column, over loopback: functions registered with
openYuanrong's JSON and invoked by URN answer openYuanrong's codes in its `{"code", "message"}` shape."""
from __future__ import annotations

import asyncio

import pytest

from tests.support.servers import FUNCTIONS, HANDLERS, make_config
from tests.support.waiting import eventually

FUNCS = "/serverless/v1/functions"
TOKENS = [{"token": "dev", "tenant": "default", "role": "developer"},
          {"token": "usr", "tenant": "default", "role": "user"}]


def urn(func: str) -> str:
    return f"sn:cn:yrk:default:function:0@faaspy@{func}:latest"


def invoke_path(func: str) -> str:
    return f"{FUNCS}/{urn(func)}/invocations"


async def register(client, func: str, handler: str, headers=None, **fields) -> None:
    body = {"name": f"0@faaspy@{func}", "runtime": "python3.9", "kind": "faas", "handler": handler,
            "codePath": str(HANDLERS), "storageType": "local", **fields}
    resp = await client.post(FUNCS, json=body, headers=headers)
    assert resp.status == 200, await resp.text()


def config(**more):
    return make_config(**{"runtime.codeRoots": [str(FUNCTIONS), str(HANDLERS)], **more})


async def error_of(resp) -> dict:
    body = await resp.json()
    assert set(body) == {"code", "message", "trace_id"}, body  # openYuanrong's shape (trace_id: its frontend's)
    assert resp.headers["X-Inner-Code"] == str(body["code"])
    return body


async def test_handler_errors_carry_openyuanrongs_user_codes(make_client):
    client = await make_client(config())
    await register(client, "raises", "testfns.raise_early")
    await register(client, "exits", "testfns.exits")
    await register(client, "unjson", "testfns.not_serializable")
    await register(client, "badinit", "testfns.counted", extendedHandler={"initializer": "testfns.init_fail"})

    resp = await client.post(invoke_path("raises"), json={})
    body = await error_of(resp)
    assert resp.status == 500 and body["code"] == 4001
    assert body["message"].startswith("Fail to run user call handler. err: ")  # openYuanrong's wording
    assert "bad input: no widgets" in body["message"]
    resp = await client.post(invoke_path("exits"), json={})
    body = await error_of(resp)
    assert resp.status == 500 and body["code"] == 4001 and "sys.exit" in body["message"]
    resp = await client.post(invoke_path("unjson"), json={})
    assert resp.status == 500 and (await error_of(resp))["code"] == 4007
    resp = await client.post(invoke_path("badinit"), json={})
    assert resp.status == 500 and (await error_of(resp))["code"] == 4201


async def test_unknown_urn_bad_body_and_too_large(make_client):
    client = await make_client(config(**{"frontend.args.maxRequestBodySize": 0.001}))
    await register(client, "echoed", "testfns.echo_sync")
    resp = await client.post(invoke_path("nobody"), json={})
    assert resp.status == 404 and (await error_of(resp))["code"] == 150424  # function metadata not found
    resp = await client.post(invoke_path("echoed"), data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await error_of(resp))["code"] == 200400
    resp = await client.post(invoke_path("echoed"), json={"pad": "x" * 4096})
    assert resp.status == 413 and (await error_of(resp))["code"] == 4140
    resp = await client.post(invoke_path("echoed"), json={"ok": 1})
    assert resp.status == 200 and await resp.json() == {"ok": 1}


async def test_timeout_is_4010(make_client):
    client = await make_client(config())
    await register(client, "sleepy", "testfns.async_sleep", timeout=1)
    resp = await client.post(invoke_path("sleepy"), json={"seconds": 30})
    assert resp.status == 504 and (await error_of(resp))["code"] == 4010


async def test_concurrency_full_is_200429(make_client):
    client = await make_client(config())
    await register(client, "one", "testfns.async_sleep", concurrentNum="1", maxInstance="1")
    first = asyncio.ensure_future(client.post(invoke_path("one"), json={"seconds": 30}))

    async def busy() -> bool:  # once the first holds the only slot, the next is refused at once
        resp = await client.post(invoke_path("one"), json={"seconds": 0})
        if resp.status == 200:
            return False
        assert resp.status == 429 and (await error_of(resp))["code"] == 200429
        return True
    try:
        await eventually(busy)
    finally:
        first.cancel()


@pytest.mark.parametrize("headers, status, code", [
    ({}, 401, 200401),
    ({"X-Auth": "wrong"}, 401, 200401),
    ({"X-Auth": "usr"}, 403, 200403),  # registering needs the developer role (a user may invoke)
])
async def test_auth_failures(make_client, headers, status, code):
    client = await make_client(config(**{"auth.tokens": TOKENS}))
    resp = await client.post(FUNCS, json={"name": "0@faaspy@echoed", "runtime": "python3.9",
                                          "handler": "testfns.echo_sync", "codePath": str(HANDLERS)},
                             headers=headers)
    assert resp.status == status and (await error_of(resp))["code"] == code
    await register(client, "echoed", "testfns.echo_sync", headers={"X-Auth": "dev"})  # X-Auth: as yrcli sends
    resp = await client.post(invoke_path("echoed"), json={"a": 1}, headers={"X-Auth": "usr"})
    assert resp.status == 200 and await resp.json() == {"a": 1}
