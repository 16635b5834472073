"""Malformed requests get a clear 4xx in the route's JSON shape and leave nothing behind: JSON and
msgpack nested beyond any recursion limit, header bytes that are not UTF-8, a refused subscribe."""
from __future__ import annotations

import asyncio

import pytest

from tests.support.servers import fn, test_config

SSE = {"Accept": "text/event-stream"}


def _url(name: str) -> str:
    return f"/serverless/v1/functions/{name}/invocations"


DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON nested far beyond Python's recursion limit


@pytest.mark.parametrize("path", [_url("recho"), "/serverless/v1/streams/deep", "/v1/chat/completions"])
async def test_deeply_nested_json_body_is_400(make_client, deploy_dir, path):
    d = deploy_dir(fn("recho", "review_fns.echo"))
    client = await make_client(test_config(d))
    resp = await client.post(path, data=DEEP)
    assert resp.status == 400, (resp.status, (await resp.read())[:200])
    assert resp.headers["Content-Type"].startswith("application/json")


async def test_deeply_nested_msgpack_element_is_400(make_client):
    """msgpack accepts ~1000 levels, json.dumps (each element is sent as JSON text) does not."""
    client = await make_client(test_config())
    body = b"\x91" + b"\x91" * 1000 + b"\x01"
    resp = await client.post("/serverless/v1/streams/deep", data=body,
                             headers={"Content-Type": "application/x-msgpack"})
    assert resp.status == 400, (resp.status, (await resp.read())[:200])


async def test_refused_subscribe_creates_no_stream(make_client):
    """`Last-Event-ID: 5` on an unknown stream is a 400, but the stream was created first and
    stayed, taking one of streams.maxStreams for good (bad input must leave nothing behind)."""
    client = await make_client(test_config(**{"streams.maxStreams": 1}))
    resp = await client.get("/serverless/v1/stream/subscribe", headers={"X-Stream-Name": "fresh", "Last-Event-ID": "5"})
    assert resp.status == 400
    assert (await (await client.get("/serverless/v1/streams")).json())["streams"] == []
    resp = await client.post("/serverless/v1/streams/other", json=["x"])
    assert resp.status == 200, await resp.text()


async def _raw_http(client, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize("header", [b"Authorization: Bearer s\xe9cret", b"X-Auth: \xff\xfe"])
async def test_non_utf8_token_is_401(make_client, header):
    """aiohttp hands non-UTF-8 header bytes over as surrogates; `str.encode()` then raised
    UnicodeEncodeError in the token check: 500 "Server got itself in trouble" (not JSON)."""
    tokens = [{"token": "secret", "tenant": "default", "role": "developer"}]
    client = await make_client(test_config(**{"auth.tokens": tokens}))
    answer = await _raw_http(client, b"GET /serverless/v1/streams HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                                     + header + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b'"code": 200401' in answer


async def test_non_utf8_terminator_header_is_400(make_client):
    """terminator_set() encodes the terminator inside the pump, after the 200 and the first
    comment went out: the UnicodeEncodeError aborted the response mid-chunk (no end, no error)."""
    client = await make_client(test_config())
    answer = await _raw_http(client, b"GET /serverless/v1/stream/subscribe HTTP/1.1\r\nHost: localhost\r\n"
                                     b"Connection: close\r\nX-Stream-Name: s\r\nX-Timeout-Ms: 300\r\n"
                                     b"X-Stream-Terminator: \xff\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]


@pytest.mark.parametrize("path", ["/serverless/v1/functions/echo/invocations", "/serverless/v1/streams/s"])
async def test_transfer_coding_other_than_chunked_is_400(make_client, path):
    """`Transfer-Encoding: gzip, chunked` was read as chunked with the gzip ignored."""
    client = await make_client(test_config())
    answer = await _raw_http(client, f"POST {path} HTTP/1.1\r\nHost: localhost\r\n".encode()
                             + b"Transfer-Encoding: gzip, chunked\r\nContent-Type: application/json\r\n\r\n"
                             + b"2\r\n{}\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b'"code": 200400' in answer and b"Transfer-Encoding" in answer
