"""RunPod's OpenAI-compatible URL of an endpoint, `/v2/{fn}/openai/v1`, with the official openai SDK."""
from __future__ import annotations

from openai import AsyncOpenAI, NotFoundError

from tests.support.openai_support import MODEL, chat_body, chat_fn, write_deploy
from tests.support.servers import test_config


async def test_openai_sdk_against_an_endpoint(make_client, tmp_path):
    deploy = write_deploy(tmp_path / "deploy", chat_fn("my-llm", tokens_per_second=2000))
    client = await make_client(config=test_config(deploy))  # openai.chatFunction stays `chat`: not deployed
    async with AsyncOpenAI(base_url=str(client.make_url("/v2/my-llm/openai/v1")), api_key="k", max_retries=0) as sdk:
        whole = await sdk.chat.completions.create(**chat_body("Hi endpoint"))
        chunks = [c async for c in await sdk.chat.completions.create(**chat_body("Hi endpoint", stream=True))]
        models = await sdk.models.list()
    assert whole.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in chunks)
    assert [m.id for m in models.data] == [MODEL]
    async with AsyncOpenAI(base_url=str(client.make_url("/v2/nope/openai/v1")), api_key="k", max_retries=0) as sdk:
        try:
            await sdk.chat.completions.create(**chat_body())
        except NotFoundError as exc:
            assert "not deployed" in exc.message
        else:
            raise AssertionError("an unknown endpoint must be a 404")
