"""The upstream backend: proxy to any OpenAI-compatible server (Ollama, vLLM, llama.cpp, ...).

Each upstream SSE event is parsed and yielded the moment its line arrives, never after reading
the whole body. Upstream failures become OpenAI-style errors with a clear message, and the
upstream connection is closed whenever this generator stops early (our client left).
"""
from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import aiohttp

from runtime.errors import FunctionServiceError
from runtime.tracing import make_traceparent

from .request import OpenAIRequest

__all__ = ("UpstreamSettings", "UpstreamError", "relay")

_MAX_BODY = 8 * 1024 * 1024  # a non-streamed answer or an error body larger than this is refused


class UpstreamError(FunctionServiceError):
    """The upstream failed: unreachable, timed out, refused, or broke mid-stream."""

    code, status = 200502, 502


class UpstreamSettings:
    """From the manifest's `environment`: `upstream_url`, `upstream_api_key` or
    `upstream_api_key_env`, `upstream_model` and `upstream_timeout` (seconds)."""

    def __init__(self, env: dict[str, str]) -> None:
        url = env.get("upstream_url", "")
        if not url.startswith(("http://", "https://")):
            raise FunctionServiceError("chat function: backend 'upstream' needs environment 'upstream_url', "
                                       f"e.g. http://localhost:11434/v1 (got {url!r})")
        self.base_url = url.rstrip("/")
        key_env = env.get("upstream_api_key_env", "")
        self.api_key = env.get("upstream_api_key") or (os.environ.get(key_env, "") if key_env else "")
        self.model = env.get("upstream_model") or None
        try:
            self.timeout = float(env.get("upstream_timeout") or 60)
        except ValueError:
            raise FunctionServiceError("chat function: environment 'upstream_timeout' must be seconds") from None


def _error_message(raw: bytes) -> str:
    """The message of an upstream error body, whatever shape it has."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500] or "(empty body)"
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:500]
    return str(err)[:500]


async def _read_bounded(resp: aiohttp.ClientResponse) -> bytes:
    body = bytearray()
    async for piece in resp.content.iter_chunked(65536):
        body += piece
        if len(body) > _MAX_BODY:
            raise UpstreamError(f"the upstream answer exceeds {_MAX_BODY} bytes")
    return bytes(body)


async def _failure(resp: aiohttp.ClientResponse) -> UpstreamError:
    message = _error_message(await _read_bounded(resp))
    if 400 <= resp.status < 500 and resp.status not in (401, 403, 407):
        # The request itself was refused (unknown model, bad parameter...): the client's to fix.
        return UpstreamError(f"upstream: {message}", code=200000 + resp.status, status=resp.status)
    return UpstreamError(f"upstream answered {resp.status}: {message}")


def _decode_event(data: str) -> dict | None:
    """A parsed `data:` payload; None for `[DONE]`; an upstream error payload raises."""
    if data.strip() == "[DONE]":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        raise UpstreamError(f"upstream sent an event that is not JSON: {data[:200]!r}") from None
    if isinstance(obj, dict) and obj.get("error"):
        raise UpstreamError(f"upstream error mid-stream: {_error_message(data.encode())}")
    if not isinstance(obj, dict):
        raise UpstreamError(f"upstream sent an event that is not a JSON object: {data[:200]!r}")
    return obj


async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """Parse SSE line by line as bytes arrive; stop at `[DONE]`; EOF before it is an error."""
    data: list[str] = []
    async for raw in resp.content:  # one line at a time, as soon as it is complete
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line.startswith(":"):
            continue
        if line:
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)
            continue
        if data:
            obj = _decode_event("\n".join(data))
            data = []
            if obj is None:
                return
            yield obj
    if data and _decode_event("\n".join(data)) is None:
        return  # a last `data: [DONE]` without its blank line, as some servers send
    raise UpstreamError("the upstream stream ended before 'data: [DONE]'")


async def relay(req: OpenAIRequest, settings: UpstreamSettings, *, trace_id: str = "") -> AsyncIterator[dict]:
    """POST the request upstream; yield each chunk as it arrives, or the one completion object.

    The request carries a W3C `traceparent` of the invocation's trace (a new span of it), so the
    upstream's own traces join the caller's."""
    url = settings.base_url + req.route.removeprefix("/v1")
    body = dict(req.body)
    if settings.model:
        body["model"] = settings.model
    headers = {"Accept": "text/event-stream" if req.stream else "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    traceparent = make_traceparent(trace_id) if trace_id else None
    if traceparent is not None:
        headers["traceparent"] = traceparent
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.timeout, sock_read=settings.timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(url, json=body, headers=headers) as resp:
                if resp.status >= 400:
                    raise await _failure(resp)
                if req.stream:
                    async for chunk in _events(resp):
                        yield chunk
                    return
                try:
                    answer = json.loads(await _read_bounded(resp))
                except ValueError:
                    raise UpstreamError("the upstream answer is not JSON") from None
                yield answer
    except TimeoutError:
        raise UpstreamError(f"the upstream at {url} sent nothing for {settings.timeout:g} s",
                            code=200504, status=504) from None
    except aiohttp.ClientPayloadError as exc:
        raise UpstreamError(f"the upstream connection broke mid-answer: {exc}") from None
    except aiohttp.ClientError as exc:
        raise UpstreamError(f"cannot reach the upstream at {url}: {type(exc).__name__}: {exc}") from None
