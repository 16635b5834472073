"""Handlers for the durable-output tests: each event is written only once the test releases it,
so a test knows exactly how far the producer is (no timing)."""
import asyncio

# marker -> {"release": events the handler may write, "written": events written, "log": [...]}
STATE: dict = {}


def state(marker):
    return STATE.setdefault(marker, {"release": 0, "written": 0, "log": []})


async def gated(event, context):
    """Writes {"i": 1..count}, event i once `release` >= i; returns {"done": count}."""
    s = state(event["marker"])
    try:
        for i in range(1, int(event["count"]) + 1):
            while s["release"] < i:
                await asyncio.sleep(0.002)
            await context.get_stream().write({"i": i})
            s["written"] = i
    except asyncio.CancelledError:
        s["log"].append("cancelled")
        raise
    s["log"].append("finished")
    return {"done": int(event["count"])}


async def gated_chat(event, context):
    """An OpenAI chat function: chunk i (content "t<i> ") once `release` >= i, for `max_tokens`
    chunks, the marker being the request's `user`; with `seed: -1` it raises after them."""
    body = event["input"]["openai_input"]
    s = state(body["user"])
    count = int(body["max_tokens"])
    for i in range(1, count + 1):
        while s["release"] < i:
            await asyncio.sleep(0.002)
        await context.get_stream().write({
            "id": "chatcmpl-gated", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "delta": {"content": f"t{i} "},
                         "finish_reason": "stop" if i == count else None}]})
        s["written"] = i
    if body.get("seed") == -1:
        raise RuntimeError("gated chat failed after its chunks")
