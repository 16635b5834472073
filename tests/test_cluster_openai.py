"""The OpenAI-compatible routes in cluster mode: a `role: frontend` node runs nothing itself, so
`/v1/chat/completions` goes through the work queue to a worker, streaming as produced."""
from __future__ import annotations

import time

import aiohttp
from openai import AsyncOpenAI

from cluster_fixtures import redis_server, start_worker  # noqa: F401
from test_cluster import frontend_args, start_server, status, wait_until, workers_serving  # noqa: F401

MODEL = "fnstream-standin"


async def test_openai_sdk_streams_a_chat_completion_through_a_worker(redis_server, start_server, start_worker):
    a = start_server(*frontend_args(redis_server.url, role="frontend"))
    start_worker(redis_server.url)
    async with aiohttp.ClientSession() as s:
        await workers_serving(s, a.url, "chat")
        done_before = sum(w["completed"] for w in (await status(s, a.url))["workers"])
        client = AsyncOpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0)
        started = time.monotonic()
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
    assert len(stamps) > 10 and stamps[0] - started < 0.4 * (stamps[-1] - started)   # arrived as produced
    assert whole.choices[0].message.content.startswith('You said: "hi"')
