"""Hostile input gets a 400 in the route's JSON shape, never a 500 text page or a stalled loop;
what cannot be encoded is refused where it is written, and nothing else is lost."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import msgpack
import pytest

from frontend.client import iter_sse
from tests.support.servers import FUNCTIONS, fn, test_config

INVOKE = "/serverless/v1/functions/{}/invocations"
STREAMS = "/serverless/v1/streams"
BIG_INT = b"1" + b"0" * 5000
SSE = {"Accept": "text/event-stream"}


async def assert_400(resp: aiohttp.ClientResponse, *words: str) -> dict:
    assert resp.status == 400, await resp.text()
    assert resp.content_type == "application/json"
    body = await resp.json()
    message = body["error"]["message"] if "error" in body else body["message"]
    for word in words:
        assert word in message, message
    return body


@pytest.fixture
async def hclient(make_client, deploy_dir):
    deploy = deploy_dir(fn("surrogates", "hostile_fns.surrogate_writer"),
                        fn("asurrogates", "hostile_fns.async_surrogate_writer"),
                        fn("bad-result", "hostile_fns.bad_result"),
                        {"name": "echo", "handler": "echo.handler", "codePath": str(FUNCTIONS)},
                        {"name": "chat", "handler": "chat.handler", "codePath": str(FUNCTIONS), "models": ["m"]})
    return await make_client(test_config(deploy))


@pytest.mark.parametrize("body, words", [
    (b'{"n": ' + BIG_INT + b"}", ["4300"]),
    (b'{"s": "\\ud800"}', ["surrogate"]),
    (b'{"s": "ok \\udfff"}', ["surrogate"]),
    (b'{"n": NaN}', ["NaN"]),
    (b'[Infinity]', ["Infinity"]),
    (b'{"n": -Infinity}', ["Infinity"]),
    (b'{"n": 1e400}', ["finite"]),
])
async def test_json_bodies_refused_on_every_json_route(hclient, body, words):
    headers = {"Content-Type": "application/json"}
    await assert_400(await hclient.post(INVOKE.format("echo"), data=body, headers=headers), *words)
    await assert_400(await hclient.post("/invocations/default/default/echo/", data=body, headers=headers), *words)
    await assert_400(await hclient.post(f"{STREAMS}/s", data=body, headers=headers), *words)
    await assert_400(await hclient.post(f"{STREAMS}/s", data=body + b"\n" + body, headers=headers))  # NDJSON
    if body.startswith(b"{"):
        chat = body[:-1] + b', "model": "m", "messages": []}'
        resp = await hclient.post("/v1/chat/completions", data=chat, headers=headers)
        assert resp.status == 400 and (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_a_valid_surrogate_pair_is_fine(hclient):
    resp = await hclient.post(INVOKE.format("echo"), data=b'{"s": "\\ud83d\\ude00"}',
                              headers={"Content-Type": "application/json"})
    assert resp.status == 200 and await resp.json() == {"s": "\U0001F600"}


@pytest.mark.parametrize("header, value", [("X-Timeout-Ms", "1e400"), ("X-Timeout-Ms", "9" * 400),
                                           ("X-Timeout-Ms", "9" * 5000), ("X-Expect-Num", "9" * 400),
                                           ("Last-Event-ID", "9" * 400)])
async def test_huge_numbers_in_parameters(hclient, header, value):
    await assert_400(await hclient.get(f"{STREAMS}/s", headers={header: value}), "parameter")
    if header == "X-Timeout-Ms":  # the only one of these a publish reads
        await assert_400(await hclient.post(f"{STREAMS}/s", json=["x"], headers={header: value}), "parameter")


@pytest.mark.parametrize("query", ["retain_seconds=1e400", "retain_seconds=nan", "retain_num=" + "9" * 400])
async def test_huge_numbers_in_publish_options(hclient, query):
    await assert_400(await hclient.post(f"{STREAMS}/s?{query}", json=["x"]), "parameter")


@pytest.mark.parametrize("payload, word", [
    (msgpack.packb([{b"bin-key": 1}], use_bin_type=True), "element 0"),
    (msgpack.packb([msgpack.ExtType(5, b"xx")], use_bin_type=True), "extension type 5"),
    (msgpack.packb([msgpack.Timestamp(1, 0)], use_bin_type=True), "element 0"),
    (msgpack.packb(["ok", float("nan")], use_bin_type=True), "element 1"),
    (msgpack.packb([{1: "int key"}], use_bin_type=True), "msgpack"),
])
async def test_hostile_msgpack(hclient, payload, word):
    resp = await hclient.post(f"{STREAMS}/mp", data=payload, headers={"Content-Type": "application/x-msgpack"})
    await assert_400(resp, word)
    assert (await hclient.get(f"{STREAMS}?stream=mp")).status == 404  # all or nothing: nothing published


async def test_yaml_bombs_are_refused_quickly_and_the_loop_stays_free(hclient):
    bomb = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
            + "".join(f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)))
    deep = "name: deep\nhandler: echo.handler\nx: " + "[" * 10_000 + "]" * 10_000
    big = b"name: big\nhandler: echo.handler\nn: " + BIG_INT
    for body, word in ((bomb, "anchor"), ("name: x\nhandler: *a\n", "alias"), (deep, "nested"), (big, "4300")):
        resp = await hclient.post("/admin/v1/functions", data=body)
        await assert_400(resp, word)
    # the deep document is refused before the parser recurses: no RecursionError in sight
    start = time.monotonic()
    health = await hclient.get("/healthz")
    assert health.status == 200 and time.monotonic() - start < 5


async def test_unencodable_writes_raise_at_the_write_and_the_stream_goes_on(hclient):
    for name in ("surrogates", "asurrogates"):
        event = {"writes": ["SURROGATE", "a", "SURROGATE", "b"]}
        resp = await hclient.post(INVOKE.format(name), json=event, headers=SSE)
        assert resp.status == 200
        events = [e["data"] async for e in iter_sse(resp)]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["results"] == ["refused", "ok", "refused", "ok"]
        written = [e for e in events[:-2] if not e.startswith("refused")]
        assert written == ["a", "b"], events
        status = await (await hclient.get(f"/admin/v1/functions/{name}")).json()
        assert status["function"]["status"]["inflight"] == 0


async def test_nan_is_never_emitted(hclient):
    resp = await hclient.post(INVOKE.format("surrogates"), json={"writes": ["NAN", "x"]}, headers=SSE)
    events = [e["data"] async for e in iter_sse(resp)]
    assert "NaN" not in "".join(events) and "x" in events
    for kind in ("nan", "surrogate"):
        resp = await hclient.post(INVOKE.format("bad-result"), json={"kind": kind})
        assert resp.content_type == "application/json"
        text = await resp.text()
        assert "NaN" not in text and json.loads(text)["code"] == 4007
        assert resp.status == 500  # a handler error: its result cannot be encoded


async def test_parser_level_refusals_answer_json(server):
    """aiohttp refuses these before any middleware: the answer is still fnstream's JSON shape."""
    async with aiohttp.ClientSession() as s:
        for headers in ({"X-Big": "x" * 20000}, {f"X-H{i}": "v" for i in range(200)}):
            async with s.get(server.url + "/healthz", headers=headers) as r:
                assert r.status in (400, 431), r.status
                assert r.content_type == "application/json", await r.text()
                body = await r.json()
                assert body["code"] >= 200400 and body["message"]
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GARBAGE / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        raw = await reader.read(4096)
        writer.close()
        assert b"application/json" in raw and b'"code"' in raw


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "utf-8-sig"])
@pytest.mark.parametrize("text", ['{"a": 1}', "[1]", "{}"])
async def test_a_json_body_in_any_encoding_json_allows_is_read(hclient, encoding, text):
    """RFC 8259 readers may accept UTF-16/32 (json.loads does, without a BOM too): a body that opens
    with `{` or `[` in UTF-16/32-LE is not UTF-8, though its first byte says so."""
    resp = await hclient.post("/serverless/v1/functions/echo/invocations", data=text.encode(encoding))
    assert resp.status == 200, await resp.text()
    assert await resp.json() == json.loads(text)
