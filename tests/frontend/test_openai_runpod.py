"""The same chat function through the function-service route with RunPod-style job bodies, and
RunPod-style handlers that frame their own SSE (rawStream) through both routes."""
import json

import pytest
from openai import AsyncOpenAI

from tests.support.openai_support import MODEL, chat_body, chat_fn, content_of, write_deploy
from tests.support.servers import fn, read_events, test_config

INVOKE = "/serverless/v1/functions/{}/invocations"
SSE = {"Accept": "text/event-stream"}


def job(route="/v1/chat/completions", **body):
    return {"input": {"openai_route": route, "openai_input": body}}


@pytest.fixture
async def rp(make_client, tmp_path):
    deploy = write_deploy(tmp_path / "deploy", chat_fn(tokens_per_second=2000),
                          fn("rp", "openai_fns.runpod_style", rawStream=True))
    return await make_client(config=test_config(deploy))


async def test_runpod_job_streams_through_the_invoke_route(rp):
    resp = await rp.post(INVOKE.format("chat"), json=job(**chat_body("Hi runpod", stream=True)), headers=SSE)
    assert resp.status == 200
    events = [ev for _, ev in await read_events(resp)]
    assert events[-1]["data"] == "[DONE]"
    chunks = [json.loads(ev["data"]) for ev in events[:-1]]
    assert [ev["id"] for ev in events[:-1]] == [str(i) for i in range(1, len(chunks) + 1)]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    whole = await (await rp.post("/v1/chat/completions", json=chat_body("Hi runpod"))).json()
    assert content_of(chunks) == whole["choices"][0]["message"]["content"]


async def test_runpod_job_as_plain_json(rp):
    """Like RunPod's aggregated stream: the list of what the handler yielded."""
    resp = await rp.post(INVOKE.format("chat"), json=job(**chat_body("Hi runpod", max_tokens=4)))
    (completion,) = await resp.json()
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == 'You said: "Hi runpod".'
    resp = await rp.post(INVOKE.format("chat"), json=job("/v1/completions", model=MODEL, prompt="Go",
                                                         stream=True, max_tokens=3))
    chunks = await resp.json()
    assert [c["object"] for c in chunks] == ["text_completion"] * 3
    # the bare inner object (no "input" wrapper) is accepted as well
    resp = await rp.post(INVOKE.format("chat"), json=job(**chat_body(max_tokens=1))["input"])
    assert (await resp.json())[0]["choices"][0]["message"]["content"] == "You"


@pytest.mark.parametrize("event, says", [
    ({"input": {"openai_input": {}}}, "'openai_route' must be one of"),
    ({"input": {"openai_route": "/v1/embeddings", "openai_input": {}}}, "'openai_route' must be one of"),
    ({"input": {"openai_route": "/v1/chat/completions"}}, "'openai_input' must be an object"),
    (job(model=MODEL, messages="hi"), "'messages' must be a non-empty list"),
])
async def test_bad_runpod_jobs_are_400(rp, event, says):
    resp = await rp.post(INVOKE.format("chat"), json=event)
    assert resp.status == 400
    assert says in (await resp.json())["message"]


async def test_self_framing_handler_is_not_framed_twice(rp):
    resp = await rp.post(INVOKE.format("rp"), json={}, headers=SSE)
    body = (await resp.read()).decode()
    assert body.startswith('data: {"id": "chatcmpl-rp"') and body.endswith("data: [DONE]")
    assert "data: data:" not in body and "\nid:" not in body
    assert body.count("\n\n") == 4


async def test_self_framing_handler_behind_the_openai_route(make_client, tmp_path):
    deploy = write_deploy(tmp_path / "deploy", fn("rp", "openai_fns.runpod_style", rawStream=True))
    client = await make_client(config=test_config(deploy, **{"openai.chatFunction": "rp"}))
    raw = (await (await client.post("/v1/chat/completions", json=chat_body(stream=True))).read()).decode()
    assert "data: data:" not in raw and raw.endswith("data: [DONE]")
    async with AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0) as sdk:
        chunks = [c async for c in await sdk.chat.completions.create(**chat_body(stream=True))]
    assert "".join(c.choices[0].delta.content for c in chunks) == "Raw frames pass through."
    assert chunks[-1].choices[0].finish_reason == "stop"
