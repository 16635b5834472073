"""The OpenAI-compatible routes in cluster mode: a `role: frontend` node runs nothing itself, so
`/v1/chat/completions` goes through the work queue to a worker, streaming as produced."""
from __future__ import annotations

import time

import aiohttp
from openai import AsyncOpenAI

from tests.support.cluster import frontend_args, status, wait_until, workers_serving

MODEL = "fnstream-standin"


async def test_openai_sdk_streams_a_chat_completion_through_a_worker(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url, role="frontend"))
    start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        await workers_serving(s, a.url, "chat")
        done_before = sum(w["completed"] for w in (await status(s, a.url))["workers"])
        client = AsyncOpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0)
        stamps, text = [], []
        stream = await client.chat.completions.create(
            model=MODEL, stream=True,
            messages=[{"role": "user", "content": "one two three four five six seven eight nine ten"}])
        async for chunk in stream:
            stamps.append(time.monotonic())
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        whole = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        await client.close()

        async def both_ran_on_the_worker():   # its heartbeat reports what it completed
            return sum(w["completed"] for w in (await status(s, a.url))["workers"]) == done_before + 2
        await wait_until(both_ran_on_the_worker, "the worker to report two completed invocations")
    assert "".join(text).startswith('You said: "one two three')
    # Arrived as produced: the stand-in paces its tokens 1/40 s apart (deploy/chat.yaml), so chunks
    # relayed as they come spread over most of that span; buffered to the end they would arrive at
    # once. (Measured from the first chunk, not from the request: a loaded machine's set-up time
    # says nothing about streaming.)
    assert len(stamps) > 10 and stamps[-1] - stamps[0] > 0.5 * (len(text) - 1) / 40
    assert whole.choices[0].message.content.startswith('You said: "hi"')


async def test_frontend_without_the_chat_code_lists_its_model_from_the_cluster(redis_server, start_server,
                                                                                tmp_path):
    """B has neither the deploy dir nor the code of `chat`; it knows the function from the cluster."""
    start_server(*frontend_args(redis_server.url, role="all"))   # A deploys chat and runs it as a worker
    b = start_server(*frontend_args(redis_server.url, role="frontend"), "-s", "runtime.deployDir=null",
                     "-s", f"runtime.codeRoots=[{tmp_path}]")
    async with aiohttp.ClientSession() as s:
        async def chat_unavailable_on_b():
            return (await status(s, b.url))["unavailable"].get("chat")
        await wait_until(chat_unavailable_on_b, "chat known (but not loadable) on B")
        async with s.get(b.url + "/v1/models") as r:
            assert r.status == 200
            assert [m["id"] for m in (await r.json())["data"]] == [MODEL]
        async with s.get(f"{b.url}/v1/models/{MODEL}") as r:
            assert r.status == 200 and (await r.json())["id"] == MODEL
        async with s.get(b.url + "/v1/models/no-such-model") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
        # ...and the model it lists is one it can serve: through A's worker.
        await workers_serving(s, b.url, "chat")
        client = AsyncOpenAI(base_url=b.url + "/v1", api_key="unused", max_retries=0)
        try:
            assert [m.id async for m in client.models.list()] == [MODEL]
            whole = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()
    assert whole.choices[0].message.content.startswith('You said: "hi"')
