"""Handlers for the CORS, tracing, logging and metrics tests."""
import asyncio

CALLS: list[str] = []


def record(event, context):
    """Notes that it ran (a refused request must never get here)."""
    CALLS.append(context.get_trace_id())
    return {"trace_id": context.get_trace_id()}


def logs(event, context):
    context.getLogger().info("handler says hello")
    return "logged"


async def fails(event, context):
    raise RuntimeError("boom")


async def slow(event, context):
    await asyncio.sleep(float(event.get("seconds", 5)) if isinstance(event, dict) else 5)
    return "late"
