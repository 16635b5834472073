"""An OpenAI stream (`/v1/chat/completions`, stream: true) is kept as an invoke's SSE is, in its own
framing: read with the real `openai` client, dropped, and read again by its X-Invocation-Id from
the events route, which replays the same `data:` bytes the answer carried (no `id:` lines).
Chunks are written only once the test releases them (tests/handlers/durable_fns.py): no timing."""
from __future__ import annotations

import asyncio
import json

import openai
import pytest

from frontend.keys import REGISTRY
from tests.support.servers import fn, test_config

EVENTS = "/serverless/v1/invocations/{}/events".format
CHAT = "/v1/chat/completions"


@pytest.fixture
async def client(make_client, deploy_dir):
    deploy = deploy_dir(fn("chat", "durable_fns.gated_chat", onDisconnect="continue"),
                        fn("chat-cancel", "durable_fns.gated_chat"))
    return await make_client(test_config(deploy, **{"frontend.args.enableEvent": True,
                                                    "openai.chatFunction": "chat"}))


def _state(client, function, marker):
    module = client.server.app[REGISTRY].get(function).code.handler.__globals__
    return module["state"](marker)


def _body(marker: str, count: int, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": count, "user": marker, **extra}


def _chunk(i: int, count: int) -> bytes:
    data = {"id": "chatcmpl-gated", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": "stop" if i == count else None}]}
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _without_pings(body: bytes) -> bytes:
    return b"".join(line for line in body.splitlines(keepends=True) if not line.startswith(b":"))


async def _until(check, what):
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def _replay(client, inv_id: str, last_event_id: int | None = None) -> bytes:
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    resp = await client.get(EVENTS(inv_id), headers=headers)
    assert resp.status == 200, await resp.text()
    return _without_pings(await resp.read())


async def test_openai_client_drops_then_reads_the_rest_exactly_once(client):
    s = _state(client, "chat", "drop")
    s["release"] = 3
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    try:
        async with sdk.chat.completions.with_streaming_response.create(**_body("drop", 6)) as resp:
            inv_id = resp.headers["X-Invocation-Id"]
            seen = []
            async for chunk in await resp.parse():
                seen.append(chunk.choices[0].delta.content)
                if len(seen) == 3:
                    break  # (the connection is closed as the block exits: a drop)
    finally:
        await sdk.close()
    assert seen == ["t1 ", "t2 ", "t3 "]
    assert s["written"] == 3  # the producer was held at 3 while the client read
    s["release"] = 6  # onDisconnect: continue: it goes on without a client
    await _until(lambda: s["written"] == 6, "the detached invocation finishing")
    rest = await _replay(client, inv_id, last_event_id=3)
    assert rest == _chunk(4, 6) + _chunk(5, 6) + _chunk(6, 6) + b"data: [DONE]\n\n"  # each once, no ids
    assert await _replay(client, inv_id) == b"".join(_chunk(i, 6) for i in range(1, 7)) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("seed", [None, -1], ids=["clean end", "error mid-stream"])
async def test_the_replay_is_the_answer_byte_for_byte(client, seed):
    marker = f"bytes-{seed}"
    _state(client, "chat", marker)["release"] = 4
    resp = await client.post(CHAT, json=_body(marker, 4, **({} if seed is None else {"seed": seed})))
    original = _without_pings(await resp.read())
    assert resp.status == 200 and original.endswith(b"data: [DONE]\n\n")
    if seed == -1:
        assert b'"error"' in original.split(b"\n\n")[-3]  # the OpenAI error event before [DONE]
    assert await _replay(client, resp.headers["X-Invocation-Id"]) == original
    assert b"id:" not in original


async def test_a_dropped_stream_by_default_ends_with_an_openai_error(make_client, deploy_dir):
    deploy = deploy_dir(fn("chat-cancel", "durable_fns.gated_chat"))
    client = await make_client(test_config(deploy, **{"frontend.args.enableEvent": True,
                                                      "openai.chatFunction": "chat-cancel"}))
    s = _state(client, "chat-cancel", "gone")
    s["release"] = 1
    resp = await client.post(CHAT, json=_body("gone", 3))
    assert (await resp.content.readuntil(b"\n\n")) == _chunk(1, 3)
    inv_id = resp.headers["X-Invocation-Id"]
    resp.close()  # the default, onDisconnect: cancel

    async def ended() -> bytes:
        return await _replay(client, inv_id)
    for _ in range(2000):
        body = await ended()
        if body.endswith(b"data: [DONE]\n\n"):
            break
        await asyncio.sleep(0.005)
    events = body.split(b"\n\n")
    assert events[0] + b"\n\n" == _chunk(1, 3) and events[-2] == b"data: [DONE]"
    error = json.loads(events[-3].removeprefix(b"data: "))
    assert set(error) == {"error"} and "disconnected" in error["error"]["message"]


async def test_cancel_by_id_ends_the_openai_stream_with_its_error(client):
    s = _state(client, "chat", "cancel")
    s["release"] = 1
    resp = await client.post(CHAT, json=_body("cancel", 3))
    assert (await resp.content.readuntil(b"\n\n")) == _chunk(1, 3)
    inv_id = resp.headers["X-Invocation-Id"]
    cancel = await client.post(f"/serverless/v1/invocations/{inv_id}/cancel")
    assert cancel.status == 200, await cancel.text()
    rest = _without_pings(await resp.read())
    error, done = rest.split(b"\n\n")[:2]
    assert json.loads(error.removeprefix(b"data: "))["error"]["message"].endswith("was cancelled by request")
    assert done == b"data: [DONE]" and s["written"] == 1
    assert await _replay(client, inv_id) == _chunk(1, 3) + rest
    assert (await client.post(f"/serverless/v1/invocations/{inv_id}/cancel")).status == 409
