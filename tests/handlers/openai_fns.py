"""Handlers for the OpenAI-route tests: a RunPod-style self-framing handler and failing ones."""
import asyncio
import json


def _chunk(text, first=False, finish=None):
    delta = {"role": "assistant", "content": text} if first else {"content": text}
    return {"id": "chatcmpl-rp", "object": "chat.completion.chunk", "created": 1, "model": "rp-model",
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


async def runpod_style(event, context):
    """Frames its own SSE as runpod-worker-ollama does: `data: {...}` + blank line, then a
    final `data: [DONE]` with no blank line after it."""
    words = ["Raw", " frames", " pass", " through."]
    for i, word in enumerate(words):
        await asyncio.sleep(0.01)
        yield f"data: {json.dumps(_chunk(word, i == 0, 'stop' if i == len(words) - 1 else None))}\n\n"
    yield "data: [DONE]"


async def fails_mid_stream(event, context):
    """Two chunks, then the model crashes."""
    yield _chunk("Half", first=True)
    yield _chunk(" an answer")
    await asyncio.sleep(0.01)
    raise RuntimeError("the model crashed")


async def returns_completion(event, context):
    """Answers `stream: false` by returning the object instead of writing it."""
    return {"id": "chatcmpl-ret", "object": "chat.completion", "created": 1, "model": "rp-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "returned"},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
