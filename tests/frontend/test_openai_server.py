"""The official openai SDK (sync and async), an EventSource-style parser and curl against a real
`fnstream serve`: what users run, over real sockets."""
import json
import shutil
import subprocess
import time

import httpx
import openai
import pytest
from httpx_sse import connect_sse

from tests.support.openai_support import MODEL, chat_fn, wait_inflight_zero, write_deploy
from tests.support.servers import ServerProcess, assert_live

KEY, DEV = "sk-test-user", "sk-test-dev"
TOKENS = [{"token": KEY, "role": "user"}, {"token": DEV, "role": "developer"}]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is streaming?"}]


def _server(tmp_path_factory, **env) -> ServerProcess:
    deploy = write_deploy(tmp_path_factory.mktemp("deploy"), chat_fn(**env))
    return ServerProcess("--deploy-dir", str(deploy), "-s", f"auth.tokens={json.dumps(TOKENS)}")


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    server = _server(tmp_path_factory, tokens_per_second=500)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    server = _server(tmp_path_factory, tokens_per_second=20, filler_words=200)
    yield server
    server.stop()


@pytest.fixture
def sdk():
    """Factory of sync SDK clients for a server; each is closed (its connections too) after the test."""
    clients: list[openai.OpenAI] = []

    def make(server, key=KEY):
        clients.append(openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0))
        return clients[-1]
    yield make
    for client in clients:
        client.close()


@pytest.fixture
async def asdk():
    """Factory of async SDK clients for a server; each is closed after the test."""
    clients: list[openai.AsyncOpenAI] = []

    def make(server, key=KEY):
        clients.append(openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0))
        return clients[-1]
    yield make
    for client in clients:
        await client.close()


def test_sync_sdk_stream_joins_to_the_whole_answer(fast, sdk):
    client = sdk(fast)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
    assert len(chunks) > 5
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert whole.choices[0].message.content == streamed
    assert streamed.startswith('You said: "What is streaming?".')
    assert whole.usage.completion_tokens == len(chunks)


def test_sync_sdk_include_usage(fast, sdk):
    chunks = list(sdk(fast).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, max_tokens=4,
                                                     stream_options={"include_usage": True}))
    assert len(chunks) == 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.completion_tokens, chunks[-1].usage.prompt_tokens) == (4, 5)
    assert all(c.usage is None for c in chunks[:-1])


async def test_async_sdk_chat_completions_and_models(fast, asdk):
    client = asdk(fast)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, seed=7)
    parts = [c.choices[0].delta.content async for c in stream]
    whole = await client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=7)
    assert "".join(parts) == whole.choices[0].message.content
    text = [c.choices[0].text async for c in await client.completions.create(
        model=MODEL, prompt="The river", max_tokens=6, stream=True)]
    done = await client.completions.create(model=MODEL, prompt="The river", max_tokens=6)
    assert len(text) == 6 and "".join(text) == done.choices[0].text
    assert done.choices[0].finish_reason == "length"
    assert [m.id async for m in client.models.list()] == [MODEL]


async def test_wrong_key_raises_authentication_error(fast, sdk, asdk):
    with pytest.raises(openai.AuthenticationError) as sync_err:
        list(sdk(fast, key="sk-wrong").chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
    assert sync_err.value.status_code == 401
    assert sync_err.value.body["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        await asdk(fast, key="sk-wrong").chat.completions.create(model=MODEL, messages=MESSAGES)
    with pytest.raises(openai.NotFoundError):
        sdk(fast).chat.completions.create(model="no-such-model", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
        sdk(fast).chat.completions.create(model=MODEL, messages=MESSAGES, n=2)


def test_eventsource_parser_sees_the_same_chunks(fast, sdk):
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        with connect_sse(http, "POST", fast.url + "/v1/chat/completions", json=body) as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            events = list(source.iter_sse())
    assert all(e.event == "message" and e.id == "" for e in events)
    assert events[-1].data == "[DONE]"
    parsed = [json.loads(e.data) for e in events[:-1]]
    sdk = list(sdk(fast).chat.completions.create(**body))
    assert [c.model_dump(exclude={"id", "created"}, exclude_unset=True) for c in sdk] == \
           [{k: v for k, v in c.items() if k not in ("id", "created")} for c in parsed]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_n_streams(fast):
    out = subprocess.run(
        ["curl", "-sN", fast.url + "/v1/chat/completions", "-H", f"Authorization: Bearer {KEY}",
         "-H", "Content-Type: application/json",
         "-d", json.dumps({"model": MODEL, "messages": MESSAGES, "stream": True, "max_tokens": 3})],
        capture_output=True, text=True, timeout=30, check=True).stdout
    lines = [ln for ln in out.split("\n") if ln]
    assert len(lines) == 4 and lines[-1] == "data: [DONE]"
    assert "".join(json.loads(ln[6:])["choices"][0]["delta"]["content"] for ln in lines[:-1]) == 'You said: "What'


def test_first_chunk_arrives_early(slow, sdk):
    start = time.monotonic()
    arrivals = []
    for _ in sdk(slow).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, max_tokens=20):
        arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 20
    assert_live(arrivals, 19 / 20)   # 20 tokens at 20 a second


def test_client_disconnect_stops_generation(slow, sdk):
    """~210 tokens at 20 per second would take over ten seconds; leaving after two chunks must
    free the function at once, which the admin API shows as nothing in flight."""
    before = wait_inflight_zero(slow.url, "chat", DEV)
    stream = sdk(slow).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    got = [next(stream), next(stream)]
    assert got[0].choices[0].delta.role == "assistant"
    during = wait_inflight_zero(slow.url, "chat", DEV, limit=0)
    assert during["inflight"] == 1
    stream.close()
    after = wait_inflight_zero(slow.url, "chat", DEV)
    assert after["inflight"] == 0
    assert after["invocations"] == before["invocations"] + 1
    assert after["failures"] == before["failures"]
