"""A small HTTP client for the CLI: JSON calls and a streaming SSE reader."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

__all__ = ("Client", "SSEEvent", "iter_sse")



class SSEEvent(dict[str, Any]):
    """One parsed SSE event: keys `event`, `id`, `data`."""


async def iter_sse(response: aiohttp.ClientResponse) -> AsyncIterator[SSEEvent]:
    """Parse an SSE body as it arrives (comments skipped, multi-line data joined with \\n)."""
    data: list[str] = []
    event: dict[str, Any] = {}
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield SSEEvent(event=event.get("event", "message"), id=event.get("id"), data="\n".join(data))
            data, event = [], {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field in ("event", "id"):
            event[field] = value


class Client:
    """Talks to a running fnstream server."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=self.headers, timeout=aiohttp.ClientTimeout(total=None))

    async def call(self, method: str, path: str, *, data: Any = None, json_body: Any = None,
                   headers: dict[str, Any] | None = None) -> tuple[int, Any]:
        async with self.session() as s:
            async with s.request(method, self.url + path, data=data, json=json_body, headers=headers) as r:
                text = await r.text()
                try:
                    return r.status, json.loads(text)
                except ValueError:
                    return r.status, text
