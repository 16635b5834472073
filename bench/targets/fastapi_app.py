"""The peer users would otherwise pick: FastAPI + uvicorn, StreamingResponse for SSE.

Same contract as bare_aiohttp. Run: python -m bench.targets.fastapi_app PORT
"""
from __future__ import annotations

import asyncio
import json
import sys

import uvicorn
from fastapi import Body, FastAPI
from fastapi.responses import StreamingResponse

__all__ = ("app",)

app = FastAPI()


@app.post("/stream")
async def stream(event: dict = Body(...)) -> StreamingResponse:
    count, first = int(event.get("count", 10)), float(event.get("first_delay_ms", 0)) / 1000
    delay, hold = float(event.get("delay_ms", 0)) / 1000, float(event.get("hold_s", 0))

    async def events():
        if first:
            await asyncio.sleep(first)
        for i in range(count):
            if i and delay:
                await asyncio.sleep(delay)
            data = json.dumps({"i": i}, separators=(",", ":"))
            yield f"id: {i + 1}\ndata: {data}\n\n"
        if hold:
            await asyncio.sleep(hold)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@app.post("/echo")
async def echo(event: dict = Body(...)) -> dict:
    return event


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                loop="auto")  # uvloop when installed (uvicorn[standard]); backlog 2048 is its default
