"""SSE framing: whatever a handler writes is what a spec-following SSE parser reads back.

The parser is httpx-sse's (the WHATWG event-stream rules: lines end at CRLF, LF or CR; one
space after the colon is dropped; comments are ignored), fed the exact bytes fnstream sends.
"""
from __future__ import annotations

import asyncio
import re

import httpx
from aiohttp import web
from httpx_sse import EventSource, ServerSentEvent
from hypothesis import given
from hypothesis import strategies as st

from frontend.sse import DONE_EVENT, PING, SSE_HEADERS, EventStream, encode_comment, encode_event, frame_raw, relay
from runtime.channel import OutputChannel

# Any text a handler can write (no lone surrogates: those cannot be sent as UTF-8 at all), with
# what SSE framing must get right drawn often: line breaks of each kind, colons, spaces.
TEXT = st.lists(st.characters(codec="utf-8") | st.sampled_from(["\r", "\n", "\r\n", ":", " ", "data: "])).map("".join)
# Event names are single-line, as the routes use them ("error", "end", "binary").
NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), min_size=1)


def parse(body: bytes) -> list[ServerSentEvent]:
    response = httpx.Response(200, headers={"content-type": SSE_HEADERS["Content-Type"]}, content=body)
    return list(EventSource(response).iter_sse())


def as_sse_sees_it(text: str) -> str:
    """SSE has no way to carry a CR: any line break arrives as LF."""
    return re.sub(r"\r\n|\r", "\n", text)


@given(data=TEXT, event_id=st.none() | st.integers(min_value=0), event=st.none() | NAMES)
def test_any_payload_written_is_what_an_sse_parser_reads_back(data: str, event_id: int | None,
                                                               event: str | None) -> None:
    [parsed] = parse(encode_event(data, event_id, event))
    assert parsed.data == as_sse_sees_it(data)
    assert parsed.event == (event or "message")
    assert parsed.id == ("" if event_id is None else str(event_id))


@given(payloads=st.lists(TEXT, max_size=8), comment=TEXT)
def test_a_stream_of_events_with_comments_and_pings_parses_event_by_event(payloads: list[str], comment: str) -> None:
    body = encode_comment(comment) + b"".join(PING + encode_event(p, i + 1) for i, p in enumerate(payloads))
    parsed = parse(body + DONE_EVENT)
    assert [e.data for e in parsed] == [*(as_sse_sees_it(p) for p in payloads), "[DONE]"]
    assert [e.id for e in parsed[:-1]] == [str(i + 1) for i in range(len(payloads))]


@given(text=TEXT)
def test_a_comment_never_becomes_an_event(text: str) -> None:
    assert parse(encode_comment(text) + PING) == []


def test_framing_is_exact_bytes() -> None:
    assert encode_event("ok") == b"data: ok\n\n"
    assert encode_event("a\nb", 7, "end") == b"event: end\nid: 7\ndata: a\ndata: b\n\n"
    assert encode_event("a\r\nb\rc") == b"data: a\ndata: b\ndata: c\n\n"
    assert encode_event("") == b"data: \n\n"
    assert encode_comment("x\ny") == b": x\n: y\n"
    assert frame_raw(["data: 1\n\n", "data: 2\n\n"]) == b"data: 1\n\ndata: 2\n\n"


# -- EventStream and relay over a real aiohttp server ----------------------------------------------
async def test_the_status_can_change_until_the_first_write(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    outcome: dict[str, object] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        stream = EventStream(request, {"X-Extra": "1"})
        stream.set_status(503)
        await stream.write(encode_event("late failure"))
        try:
            stream.set_status(500)
        except RuntimeError as exc:
            outcome["error"] = str(exc)
        return await stream.finish()

    app = web.Application()
    app.router.add_get("/", handler)
    client = await aiohttp_client(app)
    resp = await client.get("/")
    assert resp.status == 503
    assert resp.headers["Content-Type"] == SSE_HEADERS["Content-Type"]
    assert resp.headers["Cache-Control"] == "no-cache" and resp.headers["X-Extra"] == "1"
    assert await resp.read() == b"data: late failure\n\n"
    assert "after the first event" in str(outcome["error"])


async def test_finish_without_events_sends_headers_and_an_empty_body(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        return await EventStream(request).finish()

    app = web.Application()
    app.router.add_get("/", handler)
    client = await aiohttp_client(app)
    resp = await client.get("/")
    assert resp.status == 200 and await resp.read() == b""


async def test_relay_writes_each_batch_once_and_pings_while_idle(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    writes: list[bytes] = []
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        channel: OutputChannel[str] = OutputChannel(loop, 10)
        class Spy(EventStream):
            __slots__ = ()

            async def write(self, data: bytes) -> None:
                writes.append(data)
                await super().write(data)

        stream = Spy(request)
        for i in range(3):
            channel.try_put(f"data: {i}\n\n")  # queued before the relay reads: one batch

        async def later() -> None:
            await release.wait()
            channel.try_put("data: last\n\n")
            channel.close()

        producer = asyncio.ensure_future(later())
        await relay(stream, channel, 0.05, frame_raw)
        await producer
        return await stream.finish()

    app = web.Application()
    app.router.add_get("/", handler)
    client = await aiohttp_client(app)
    resp = await client.get("/")
    first = await resp.content.readuntil(b"data: 2\n\n")
    assert first == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert await resp.content.readuntil(PING) == PING  # idle past the heartbeat: a ping, no event
    release.set()
    rest = await resp.read()
    assert rest.endswith(b"data: last\n\n") and set(rest.replace(b"data: last\n\n", b"").split(PING)) <= {b""}
    assert writes[0] == first                       # the three queued events went out in one write
    assert writes[-1] == b"data: last\n\n"
    assert PING in writes


async def test_one_clock_beats_for_every_relay_and_ends_with_the_last(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    """Heartbeats come from one task per loop (frontend/sse.py), not a timer per stream and batch:
    each quiet stream gets its pings at its own period, a busy one none, and no task is left
    once the last relay has ended."""
    from frontend import sse

    channels: dict[str, OutputChannel[str]] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        name, every = request.query["name"], float(request.query["every"])
        channel = channels[name] = OutputChannel(asyncio.get_running_loop(), 10)
        stream = EventStream(request)
        await relay(stream, channel, every, frame_raw)
        return await stream.finish()

    app = web.Application()
    app.router.add_get("/", handler)
    client = await aiohttp_client(app)
    quiet = asyncio.ensure_future(client.get("/", params={"name": "quiet", "every": "0.05"}))
    slow = asyncio.ensure_future(client.get("/", params={"name": "slow", "every": "30"}))
    quiet_resp = await quiet  # its headers go out with its first ping
    while "slow" not in channels:
        await asyncio.sleep(0.01)
    clock = sse._clock()
    assert clock._task is not None and len(clock._beats) == 2  # one task for both streams
    assert await quiet_resp.content.readuntil(PING) == PING
    assert await quiet_resp.content.readuntil(PING) == PING  # and again: each quiet period
    channels["slow"].try_put("data: x\n\n")
    slow_resp = await slow
    assert await slow_resp.content.readuntil(b"\n\n") == b"data: x\n\n"  # its first bytes: no ping
    for channel in channels.values():
        channel.close()
    assert not (await quiet_resp.read()).replace(PING, b"")
    assert await slow_resp.read() == b""
    assert clock._task is None and not clock._beats
