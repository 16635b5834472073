"""The ceiling: a bare aiohttp server with the benchmark contract and nothing in between.

`POST /stream` answers SSE, one `await response.write()` per event (what a naive server does);
`POST /echo` answers the JSON body. It runs as a user picking the fastest plain stack would run it:
on uvloop with a 2048-connection listen backlog (uvicorn's defaults), so fnstream is measured against
what a user would otherwise deploy. Run: python -m bench.targets.bare_aiohttp PORT [asyncio]
"""
from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

__all__ = ("BACKLOG", "build_app")

BACKLOG = 2048

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


def _params(event: dict) -> tuple[int, float, float, float]:
    return (int(event.get("count", 10)), float(event.get("first_delay_ms", 0)) / 1000,
            float(event.get("delay_ms", 0)) / 1000, float(event.get("hold_s", 0)))


async def stream(request: web.Request) -> web.StreamResponse:
    count, first, delay, hold = _params(await request.json())
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    if first:
        await asyncio.sleep(first)
    for i in range(count):
        if i and delay:
            await asyncio.sleep(delay)
        data = json.dumps({"i": i}, separators=(",", ":"))
        await response.write(f"id: {i + 1}\ndata: {data}\n\n".encode())
    if hold:
        await asyncio.sleep(hold)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def echo(request: web.Request) -> web.Response:
    body = await request.json()
    return web.Response(text=json.dumps(body, separators=(",", ":")), content_type="application/json")


def build_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/stream", stream)
    app.router.add_post("/echo", echo)
    return app


async def serve(port: int) -> None:
    runner = web.AppRunner(build_app(), handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=BACKLOG).start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    plain = sys.argv[2:] == ["asyncio"]  # the same server on asyncio's own loop, for the uvloop comparison
    if plain:
        asyncio.run(serve(int(sys.argv[1])))
    else:
        import uvloop

        uvloop.run(serve(int(sys.argv[1])))
