"""OpenAI-compatible routes over the in-process client: wire format, validation, errors, config."""
import json
import time

import pytest
from openai import APIError, AsyncOpenAI

from tests.support.openai_support import MODEL, chat_body, chat_fn, chunks_of, content_of, sse_events, write_deploy
from tests.support.servers import assert_live, fn, test_config

CHAT = "/v1/chat/completions"


@pytest.fixture
def deploy(tmp_path):
    def factory(*functions):
        return write_deploy(tmp_path / "deploy", *functions)
    return factory


@pytest.fixture
async def oai(make_client, deploy):
    """A client of an app whose `chat` is the stand-in at a fast pace."""
    return await make_client(config=test_config(deploy(chat_fn(tokens_per_second=2000))))


async def test_stream_wire_format(oai):
    resp = await oai.post(CHAT, json=chat_body(stream=True))
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["Cache-Control"] == "no-cache"
    body = await resp.read()
    assert b"\nid:" not in body and not body.startswith(b"id:")
    chunks = chunks_of(body)  # every event is one `data:` line and a blank line, then [DONE]
    assert len(chunks) > 5
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == MODEL and isinstance(c["created"], int) and c["system_fingerprint"]
        assert "usage" not in c
        (choice,) = c["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert content_of(chunks).startswith('You said: "Hello there".')


async def test_stream_joins_to_the_whole_answer(oai):
    streamed = chunks_of(await (await oai.post(CHAT, json=chat_body("Tell me more", stream=True))).read())
    resp = await oai.post(CHAT, json=chat_body("Tell me more"))
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/json")
    whole = await resp.json()
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": content_of(streamed), "refusal": None}
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert whole["usage"]["completion_tokens"] == len(streamed)
    assert whole["usage"]["total_tokens"] == whole["usage"]["prompt_tokens"] + len(streamed)


async def test_include_usage_adds_one_last_chunk(oai):
    body = chat_body(stream=True, stream_options={"include_usage": True})
    chunks = chunks_of(await (await oai.post(CHAT, json=body)).read())
    *content, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(content)
    assert last["usage"]["prompt_tokens"] == 2
    assert all(c["usage"] is None for c in content)


async def test_max_tokens_stop_and_seed(oai):
    chunks = chunks_of(await (await oai.post(CHAT, json=chat_body(stream=True, max_tokens=3))).read())
    assert len(chunks) == 3 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert content_of(chunks) == 'You said: "Hello'
    whole = await (await oai.post(CHAT, json=chat_body(max_completion_tokens=2))).json()
    assert whole["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "You said:",
                                                           "refusal": None},
                                   "logprobs": None, "finish_reason": "length"}
    stopped = await (await oai.post(CHAT, json=chat_body("a b c d", stop=["c", "zzz"]))).json()
    assert stopped["choices"][0]["message"]["content"] == 'You said: "a b '
    assert stopped["choices"][0]["finish_reason"] == "stop"
    answers = []
    for seed in (1, 1, 2):
        whole = await (await oai.post(CHAT, json=chat_body(seed=seed, user="u-1", temperature=0.7))).json()
        answers.append(whole["choices"][0]["message"]["content"])
    assert answers[0] == answers[1] != answers[2]


async def test_completions_stream_and_whole(oai):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5}
    chunks = chunks_of(await (await oai.post("/v1/completions", json={**body, "stream": True})).read())
    assert len(chunks) == 5
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    whole = await (await oai.post("/v1/completions", json=body)).json()
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in chunks)
    assert whole["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    echoed = await (await oai.post("/v1/completions", json={**body, "echo": True})).json()
    assert echoed["choices"][0]["text"] == "Once upon a time" + whole["choices"][0]["text"]


@pytest.mark.parametrize("body, says", [
    ({"model": MODEL}, "missing required parameter 'messages'"),
    ({"model": MODEL, "messages": []}, "'messages' must be a non-empty list"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "'messages[0].role' must be one of"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, "'messages[0].content' must be"),
    ({"messages": [{"role": "user", "content": "x"}]}, "missing required parameter 'model'"),
    (chat_body(n=2), "'n' must be 1"),
    (chat_body(max_tokens=0), "'max_tokens' must be an integer >= 1"),
    (chat_body(max_tokens="ten"), "'max_tokens' must be an integer >= 1"),
    (chat_body(max_tokens=True), "'max_tokens' must be an integer >= 1"),
    (chat_body(temperature=3), "'temperature' must be a number between 0 and 2"),
    (chat_body(temperature="hot"), "'temperature' must be a number between 0 and 2"),
    (chat_body(stream="yes"), "'stream' must be true or false"),
    (chat_body(stream_options={"include_usage": True}), "'stream_options' is only allowed when 'stream' is true"),
    (chat_body(stop=["a", "b", "c", "d", "e"]), "'stop' must be"),
    (chat_body(seed=1.5), "'seed' must be an integer"),
    ([1, 2], "the request body must be a JSON object"),
])
async def test_bad_requests_are_400_with_openai_errors(oai, body, says):
    resp = await oai.post(CHAT, json=body)
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert says in err["message"] and err["type"] == "invalid_request_error" and "code" in err


async def test_bad_completions_and_bad_json(oai):
    resp = await oai.post("/v1/completions", json={"model": MODEL})
    assert resp.status == 400 and "'prompt'" in (await resp.json())["error"]["message"]
    resp = await oai.post(CHAT, data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]["message"]
    resp = await oai.get(CHAT)
    assert resp.status == 405 and "message" in (await resp.json())["error"]


async def test_models_and_unknown_model(oai):
    listing = await (await oai.get("/v1/models")).json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == [MODEL]
    assert listing["data"][0]["object"] == "model"
    assert (await (await oai.get(f"/v1/models/{MODEL}")).json())["id"] == MODEL
    resp = await oai.get("/v1/models/gpt-9")
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"
    resp = await oai.post(CHAT, json={**chat_body(stream=True), "model": "gpt-9"})
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"


async def test_routes_follow_the_openai_config(make_client, deploy):
    functions = deploy(chat_fn(tokens_per_second=2000), chat_fn("other", models=["m2"], tokens_per_second=2000))
    client = await make_client(config=test_config(functions, **{"openai.completionsFunction": "other",
                                                                  "openai.chatFunction": "missing"}))
    resp = await client.post(CHAT, json={**chat_body(), "model": "nobody-serves-this"})
    message = (await resp.json())["error"]["message"]
    assert resp.status == 404 and "'missing' is not deployed" in message and "openai.chatFunction" in message
    assert "'nobody-serves-this'" in message and "models:" in message
    resp = await client.post("/v1/completions", json={"model": "m2", "prompt": "x", "max_tokens": 2})
    assert (await resp.json())["model"] == "m2"
    assert [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]] == ["m2", MODEL]


async def test_a_function_declaring_a_model_serves_it_without_a_setting(make_client, deploy):
    """`models:` routes: the chat route reaches `other` for its model though `chat` is the mapped
    function, an alias too; the mapped function keeps the models it declares."""
    other = {**chat_fn("other", models=["m2"], tokens_per_second=2000), "modelAliases": {"gpt-x": "m2"}}
    functions = deploy(chat_fn(tokens_per_second=2000), other)
    client = await make_client(config=test_config(functions))
    for model in ("m2", "gpt-x", MODEL):
        resp = await client.post(CHAT, json={**chat_body(), "model": model})
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["model"] == ("m2" if model == "gpt-x" else model)
    resp = await client.post(CHAT, json={**chat_body(), "model": "gpt-9"})
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"


async def test_error_after_the_stream_began(make_client, deploy):
    functions = deploy(fn("crashy", "openai_fns.fails_mid_stream"))
    client = await make_client(config=test_config(functions, **{"openai.chatFunction": "crashy"}))
    resp = await client.post(CHAT, json=chat_body(stream=True))
    assert resp.status == 200
    data = sse_events(await resp.read())
    assert [json.loads(d)["choices"][0]["delta"]["content"] for d in data[:2]] == ["Half", " an answer"]
    err = json.loads(data[2])["error"]
    assert "the model crashed" in err["message"] and err["type"] == "server_error"
    assert data[3:] == ["[DONE]"]
    seen = []
    async with AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0) as sdk:
        with pytest.raises(APIError, match="the model crashed"):
            async for chunk in await sdk.chat.completions.create(model=MODEL, stream=True,
                                                                messages=[{"role": "user", "content": "x"}]):
                seen.append(chunk.choices[0].delta.content)
    assert seen == ["Half", " an answer"]


async def test_function_returning_the_object(make_client, deploy):
    functions = deploy(fn("ret", "openai_fns.returns_completion"))
    client = await make_client(config=test_config(functions, **{"openai.chatFunction": "ret"}))
    whole = await (await client.post(CHAT, json=chat_body())).json()
    assert whole["choices"][0]["message"]["content"] == "returned"


async def test_heartbeat_is_a_comment_line_the_sdk_ignores(make_client, deploy):
    functions = deploy(chat_fn(tokens_per_second=4, filler_words=1))
    client = await make_client(config=test_config(functions, **{"frontend.args.heartbeatSeconds": 0.1}))
    body = chat_body("hi", stream=True, max_tokens=3)
    raw = await (await client.post(CHAT, json=body)).read()
    assert b": ping\n" in raw and b": ping\n\n" not in raw
    assert content_of(chunks_of(raw)) == 'You said: "hi".'
    async with AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0) as sdk:
        parts = [c.choices[0].delta.content async for c in await sdk.chat.completions.create(**body)]
    assert "".join(parts) == 'You said: "hi".'


async def test_openai_auth_errors_have_the_openai_shape(make_client, deploy):
    tokens = [{"token": "sk-user", "role": "user"}, {"token": "sk-other", "tenant": "acme"}]
    client = await make_client(config=test_config(deploy(chat_fn(tokens_per_second=2000)), **{"auth.tokens": tokens}))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = await client.post(CHAT, json=chat_body(), headers=headers)
        assert resp.status == 401
        err = (await resp.json())["error"]
        assert err["type"] == "authentication_error" and err["message"]
    resp = await client.post(CHAT, json=chat_body(), headers={"Authorization": "Bearer sk-other"})
    # another tenant's chat function is not acme's: an unknown name, in the OpenAI shape
    assert resp.status == 404 and (await resp.json())["error"]["type"] == "not_found_error"
    resp = await client.post(CHAT, json=chat_body(max_tokens=2), headers={"Authorization": "Bearer sk-user"})
    assert resp.status == 200


async def test_events_arrive_while_the_stand_in_generates(make_client, deploy):
    client = await make_client(config=test_config(deploy(chat_fn(tokens_per_second=25))))
    start = time.monotonic()
    resp = await client.post(CHAT, json=chat_body(stream=True, max_tokens=15))
    arrivals = []
    async for line in resp.content:
        if line.startswith(b"data: {"):
            arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 15
    assert_live(arrivals, 14 / 25)   # 15 tokens at 25 a second


async def test_model_aliases_answer_pinned_openai_names_and_are_listed(make_client, deploy):
    functions = deploy(chat_fn(tokens_per_second=2000, models=[MODEL]) | {"modelAliases": {"gpt-4o-mini": MODEL}})
    client = await make_client(config=test_config(functions))
    listing = [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    assert listing == [MODEL, "gpt-4o-mini"]
    assert (await (await client.get("/v1/models/gpt-4o-mini")).json())["id"] == "gpt-4o-mini"
    async with AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0) as sdk:
        chunks = [c async for c in await sdk.chat.completions.create(
            model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "hi"}])]
    assert chunks and {c.model for c in chunks} == {MODEL}  # the function was asked for the model it serves
    resp = await client.post(CHAT, json={**chat_body(), "model": "gpt-4o"})
    assert resp.status == 404


async def test_with_no_models_the_function_name_is_listed(make_client, deploy):
    client = await make_client(config=test_config(deploy(chat_fn("chat", models=[], tokens_per_second=2000))))
    assert [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]] == ["chat"]
    resp = await client.post(CHAT, json={**chat_body(), "model": "anything"})
    assert resp.status == 200


@pytest.mark.parametrize("aliases, says", [
    ({"gpt-4o-mini": "not-served"}, "which is not in models"),
    ({MODEL: MODEL}, "is already one of the function's models"),
    ({"": MODEL}, "must be non-empty"),
])
async def test_bad_model_aliases_are_refused_at_deploy(client, aliases, says):
    resp = await client.post("/admin/v1/functions", json=chat_fn("aliased") | {"modelAliases": aliases})
    assert resp.status == 400 and says in (await resp.json())["message"]
