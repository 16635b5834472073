"""Every invoke answer names its invocation (`X-Invocation-Id`), through either door: the front
door's fast lane, and the app path (a request with an `Origin` takes it, as a browser's does)."""
from __future__ import annotations

import re

import pytest

from tests.support.openai_support import chat_body, chat_fn
from tests.support.servers import fn, test_config

INVOKE = "/serverless/v1/functions/{}/invocations".format
ID = re.compile(r"[A-Za-z0-9_-]{22,}")  # token_urlsafe(16): 128 bits
DOORS = {"fast lane": {}, "app path": {"Origin": "http://page.example"}}
SSE = {"Accept": "text/event-stream"}


@pytest.fixture
async def client(make_client, deploy_dir):
    deploy = deploy_dir(fn("aecho", "testfns.echo_async"), fn("raises", "testfns.raise_early"),
                        fn("ticker", "testfns.sync_ticker"), fn("mid", "testfns.raise_mid"),
                        fn("gen", "testfns.gen"), chat_fn(tokens_per_second=5000))
    return await make_client(test_config(deploy, **{"frontend.args.enableEvent": True,
                                                    "frontend.cors.allowOrigins": ["http://page.example"]}))


ANSWERS = [
    ("json", INVOKE("aecho"), {}, {"a": 1}, 200),
    ("json generator", INVOKE("gen"), {}, {"count": 2}, 200),
    ("json, the handler raised", INVOKE("raises"), {}, {}, 500),
    ("sse", INVOKE("ticker"), SSE, {"count": 2, "delay_ms": 1}, 200),
    ("sse, raised mid-stream", INVOKE("mid"), SSE, {}, 200),
    ("sse, raised before any event", INVOKE("raises"), SSE, {}, 500),
    ("short route", "/invocations/default/default/aecho/", {}, {}, 200),
    ("openai stream", "/v1/chat/completions", {}, chat_body(stream=True), 200),
    ("openai whole", "/v1/chat/completions", {}, chat_body(), 200),
    ("runpod /v2 openai", "/v2/chat/openai/v1/chat/completions", {}, chat_body(stream=True), 200),
]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("kind, path, headers, body, status", ANSWERS, ids=[a[0] for a in ANSWERS])
async def test_every_invoke_answer_names_its_invocation(client, door, kind, path, headers, body, status):
    resp = await client.post(path, json=body, headers={**headers, **DOORS[door]})
    await resp.read()
    assert resp.status == status
    assert ID.fullmatch(resp.headers["X-Invocation-Id"]), resp.headers
    if door == "app path":  # a browser may read it
        assert "X-Invocation-Id" in resp.headers["Access-Control-Expose-Headers"]


@pytest.mark.parametrize("door", DOORS)
async def test_invocation_ids_differ_and_are_not_the_trace_id(client, door):
    seen = set()
    for _ in range(20):
        resp = await client.post(INVOKE("aecho"), json={}, headers=DOORS[door])
        assert resp.status == 200
        seen.add(resp.headers["X-Invocation-Id"])
        assert resp.headers["X-Invocation-Id"] != resp.headers["X-Trace-Id"]
    assert len(seen) == 20


async def test_a_refusal_before_any_invocation_names_none(client):
    resp = await client.post(INVOKE("missing"), json={})
    assert resp.status == 404 and "X-Invocation-Id" not in resp.headers


def test_ids_are_unique_across_threads_and_a_fork():
    """Ids are made in batches: each is handed out once, in threads, and a forked child makes its own."""
    import os
    import threading

    from runtime.invocation_ids import new_invocation_id

    seen: list[str] = []

    def take() -> None:
        seen.extend(new_invocation_id() for _ in range(500))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == len(seen) == 2000
    assert all(ID.fullmatch(i) and len(i) == 22 for i in seen)
    read, write = os.pipe()
    pending = new_invocation_id()  # the parent has more of its batch left
    pid = os.fork()
    if pid == 0:  # the child: its next id is not one of the parent's batch
        os.write(write, new_invocation_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    ours = [new_invocation_id() for _ in range(64)]
    assert child not in ours and child != pending and ID.fullmatch(child)
