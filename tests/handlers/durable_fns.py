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
