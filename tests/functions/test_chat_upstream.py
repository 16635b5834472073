"""The chat function's `upstream` backend, proxying to a second fnstream (a real process) or to
small misbehaving servers: pass-through as chunks arrive, errors, timeouts, disconnects."""
import asyncio
import json
import time

import pytest
from aiohttp import web
from openai import AsyncOpenAI

from tests.support.openai_support import MODEL, chat_body, chat_fn, sse_events, wait_inflight_zero, write_deploy
from tests.support.servers import ServerProcess, assert_live, test_config

KEY, DEV = "sk-up-user", "sk-up-dev"
CHAT = "/v1/chat/completions"


def _upstream(directory) -> ServerProcess:
    deploy = write_deploy(directory, chat_fn(tokens_per_second=20, filler_words=200))
    tokens = [{"token": KEY, "role": "user"}, {"token": DEV, "role": "developer"}]
    return ServerProcess("--deploy-dir", str(deploy), "-s", f"auth.tokens={json.dumps(tokens)}")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    server = _upstream(tmp_path_factory.mktemp("upstream"))
    yield server
    server.stop()


@pytest.fixture
def proxy(make_client, tmp_path):
    """Factory: an in-process frontend whose `chat` proxies to `url` (any model accepted)."""
    async def factory(url: str, **env):
        env = {"backend": "upstream", "upstream_url": url, "upstream_api_key": KEY, **env}
        deploy = write_deploy(tmp_path / "proxy", chat_fn(models=[], **env))
        return await make_client(config=test_config(deploy))
    return factory


@pytest.fixture
async def sdk():
    """Factory of async SDK clients; each is closed (its connections too) after the test."""
    clients: list[AsyncOpenAI] = []

    def make(base_url: str, key: str = "unused") -> AsyncOpenAI:
        clients.append(AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0))
        return clients[-1]
    yield make
    for client in clients:
        await client.close()


async def test_chunks_pass_through_as_they_arrive(upstream, proxy, sdk):
    front = await proxy(upstream.url + "/v1")
    body = chat_body("Relay this", max_tokens=20, stream=True, stream_options={"include_usage": True})
    start = time.monotonic()
    arrivals, chunks = [], []
    async for chunk in await sdk(str(front.make_url("/v1"))).chat.completions.create(**body):
        arrivals.append(time.monotonic() - start)
        chunks.append(chunk)
    assert len(chunks) == 21 and chunks[-1].usage.completion_tokens == 20
    assert_live(arrivals[:20], 19 / 20)   # 20 tokens at 20 a second
    direct = await sdk(upstream.url + "/v1", KEY).chat.completions.create(**chat_body("Relay this", max_tokens=20))
    assert "".join(c.choices[0].delta.content for c in chunks[:-1]) == direct.choices[0].message.content
    assert chunks[0].system_fingerprint == "fp_fnstream_standin"


async def test_whole_answers_and_completions(upstream, proxy, sdk):
    front = sdk(str((await proxy(upstream.url + "/v1/")).make_url("/v1")))
    direct = sdk(upstream.url + "/v1", KEY)
    ours = await front.chat.completions.create(**chat_body("Whole", max_tokens=5))
    theirs = await direct.chat.completions.create(**chat_body("Whole", max_tokens=5))
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage.completion_tokens == 5
    text = [c.choices[0].text async for c in await front.completions.create(model=MODEL, prompt="P", max_tokens=4,
                                                                            stream=True)]
    assert len(text) == 4


async def test_upstream_refusals_become_openai_errors(upstream, proxy):
    front = await proxy(upstream.url + "/v1")
    resp = await front.post(CHAT, json={**chat_body(stream=True), "model": "not-upstream"})
    assert resp.status == 404
    assert "upstream: The model 'not-upstream' does not exist" in (await resp.json())["error"]["message"]
    front = await proxy(upstream.url + "/v1", upstream_api_key="sk-wrong")
    resp = await front.post(CHAT, json=chat_body())
    assert resp.status == 502  # our key to the upstream is wrong: not the client's fault
    err = (await resp.json())["error"]
    assert "upstream answered 401" in err["message"] and err["type"] == "server_error"


async def test_unreachable_upstream(proxy):
    from tests.support.servers import free_port
    front = await proxy(f"http://127.0.0.1:{free_port()}/v1")
    for stream in (False, True):
        resp = await front.post(CHAT, json=chat_body(stream=stream))
        assert resp.status == 502
        assert "cannot reach the upstream" in (await resp.json())["error"]["message"]


async def test_upstream_timeout(proxy, aiohttp_server):
    async def silent(request):
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", silent)
    server = await aiohttp_server(app)
    front = await proxy(str(server.make_url("/v1")), upstream_timeout="0.2")
    resp = await front.post(CHAT, json=chat_body(stream=True))
    assert resp.status == 504
    assert "sent nothing for 0.2 s" in (await resp.json())["error"]["message"]


async def test_upstream_sse_oddities(proxy, aiohttp_server):
    """Comments, CRLF lines, and a last `data: [DONE]` without its blank line still work;
    an upstream error event becomes ours."""
    async def odd(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
        await resp.write(b": keepalive\r\n" + f"data: {json.dumps(chunk)}\r\n\r\n".encode())
        if body["messages"][0]["content"] == "fail":
            await resp.write(b'data: {"error": {"message": "out of memory"}}\n\n')
        else:
            await resp.write(b"data: [DONE]")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", odd)
    front = await proxy(str((await aiohttp_server(app)).make_url("/v1")))
    data = sse_events(await (await front.post(CHAT, json=chat_body("fine", stream=True))).read())
    assert [json.loads(d)["choices"][0]["delta"]["content"] for d in data[:-1]] == ["ok"]
    data = sse_events(await (await front.post(CHAT, json=chat_body("fail", stream=True))).read())
    assert len(data) == 3 and "out of memory" in json.loads(data[1])["error"]["message"]


async def test_upstream_dying_mid_stream_gives_an_error_event_and_done(proxy, tmp_path):
    dying = _upstream(tmp_path / "dying")
    try:
        front = await proxy(dying.url + "/v1")
        resp = await front.post(CHAT, json=chat_body("Die", stream=True))
        assert resp.status == 200
        data, killed = [], False
        async for line in resp.content:
            if line.startswith(b"data: "):
                data.append(line[6:].decode().strip())
                if len(data) == 2 and not killed:
                    dying.proc.kill()  # the upstream process dies mid-answer
                    killed = True
    finally:
        dying.stop()
    assert data[-1] == "[DONE]"
    err = json.loads(data[-2])["error"]
    assert "upstream" in err["message"] and err["type"] == "server_error"
    assert all("choices" in json.loads(d) for d in data[:-2])
    assert len(data) < 100  # the answer (over 200 tokens) was not finished


async def test_client_disconnect_closes_the_upstream_request(upstream, proxy):
    """~210 tokens at 20 per second upstream; our client leaves after two chunks. Both our chat
    function and the upstream's are then idle, which only happens if the upstream request closed."""
    front = await proxy(upstream.url + "/v1")
    before = await asyncio.to_thread(wait_inflight_zero, upstream.url, "chat", DEV)
    resp = await front.post(CHAT, json=chat_body("Leave early", stream=True))
    seen = 0
    async for line in resp.content:
        seen += line.startswith(b"data: {")
        if seen == 2:
            break
    during = await asyncio.to_thread(wait_inflight_zero, upstream.url, "chat", DEV, 0)
    assert during["inflight"] == 1
    resp.close()
    after = await asyncio.to_thread(wait_inflight_zero, upstream.url, "chat", DEV)
    assert after["inflight"] == 0 and after["invocations"] == before["invocations"] + 1
    for _ in range(100):
        ours = (await (await front.get("/admin/v1/functions/chat")).json())["function"]["status"]
        if ours["inflight"] == 0:
            break
        await asyncio.sleep(0.05)
    assert ours["inflight"] == 0


async def test_upstream_request_carries_the_callers_trace(proxy, aiohttp_server):
    seen: list[str] = []

    async def answer(request):
        seen.append(request.headers.get("traceparent", ""))
        return web.json_response({"id": "x", "object": "chat.completion", "choices": []})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    server = await aiohttp_server(app)
    front = await proxy(str(server.make_url("/v1")))
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    resp = await front.post(CHAT, json=chat_body(), headers={"traceparent": incoming})
    assert resp.status == 200, await resp.text()
    version, trace_id, span_id, flags = seen[0].split("-")
    assert (version, trace_id, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "01")
    assert span_id != "00f067aa0ba902b7" and len(span_id) == 16  # a new span of the same trace
    assert resp.headers["X-Trace-Id"] == trace_id
