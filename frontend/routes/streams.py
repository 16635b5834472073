"""Named streams over REST: subscribe (SSE or msgpack), publish, list, delete.

`GET /serverless/v1/stream/subscribe` takes openYuanrong's headers (or the same as query
parameters); `GET /serverless/v1/streams/{name}` is the same subscription for a browser
`EventSource`, which cannot set headers. One SSE event per element: `id:` is its sequence id,
`data:` its UTF-8 text, or base64 with `event: binary`. The response ends on a terminator (sent
as the final event), on expect_num, on the idle timeout (`event: end`), or with `event: error`.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any, ClassVar

import msgpack
from aiohttp import web

from runtime.errors import BadRequestError, BodyTooLargeError, FunctionServiceError
from runtime.streams import (
    AbstractSubscription,
    Element,
    StreamOptions,
    StreamStats,
    SubscriptionEndedError,
    terminator_set,
    terminator_text,
    validate_stream_name,
)
from runtime.streams.errors import TooManyElementsError
from runtime.streams.tenancy import qualify, tenant_of, unqualify

from .. import safe_json
from ..body import read_body
from ..keys import BROKER, CONFIG
from ..negotiation import parse_accept, quality
from ..sse import PING, EventStream, encode_comment, encode_event
from ..tenancy import stream_tenant

__all__ = ("routes", "parse_elements", "OPEN_SUBSCRIPTIONS", "OpenSubscriptions")

log = logging.getLogger("fnstream.frontend")
routes = web.RouteTableDef()

_SHUTDOWN = "shutdown"


class OpenSubscriptions:
    """The REST subscriptions open now. On shutdown (runtime/lifecycle.py `end_streams`) each is
    closed and its response ends with `event: end` (reason shutdown), instead of being cut when
    the grace runs out."""

    def __init__(self) -> None:
        self.open: set[AbstractSubscription] = set()
        self.shutting_down = False

    async def end_all(self) -> None:
        self.shutting_down = True
        for sub in list(self.open):
            await sub.close()


OPEN_SUBSCRIPTIONS = web.AppKey("open_subscriptions", OpenSubscriptions)

MSGPACK = "application/x-msgpack"
LOST_CODE = 330416  # an `event: error` that is not the end: ids asked for are no longer retained


# -- request parameters ----------------------------------------------------------------------
MAX_PARAM = 10**15  # any count, id or duration (ms) beyond this is a mistake or an attack (OverflowError)
_MAX_PARAM_DIGITS = 40
def _param(request: web.Request, header: str | None, query: str) -> str | None:
    value = request.headers.get(header) if header else None
    if value is None:
        value = request.query.get(query)
    return value


def _int_param(request: web.Request, header: str | None, query: str, minimum: int) -> int | None:
    raw = _param(request, header, query)
    if raw is None or raw.strip() == "":
        return None
    where = f"{header} / {query}" if header else query
    try:
        value = int(raw.strip()) if len(raw) <= _MAX_PARAM_DIGITS else None
    except ValueError:
        value = None
    if value is None or value > MAX_PARAM:
        raise BadRequestError(f"parameter {where} must be an integer from {minimum} to {MAX_PARAM}, "
                              f"got {raw[:40]!r}") from None
    if value < minimum:
        raise BadRequestError(f"parameter {where} must be an integer >= {minimum}, got {value}")
    return value


def _float_param(request: web.Request, query: str) -> float | None:
    raw = request.query.get(query)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequestError(f"parameter {query} must be a number >= 0, got {raw[:40]!r}") from None
    if not 0 <= value <= MAX_PARAM:  # also NaN and inf ("1e400")
        raise BadRequestError(f"parameter {query} must be a number >= 0, got {raw[:40]!r}")
    return value


# -- output formats --------------------------------------------------------------------------
class _SSE:
    """Elements as Server-Sent Events."""

    headers: ClassVar[dict[str, str]] = {}
    ping = PING

    @staticmethod
    def opened(name: str) -> bytes:
        return encode_comment(f"subscribed to {name}")

    @staticmethod
    def element(el: Element) -> bytes:
        try:
            text = el.data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\r" in text:  # SSE would turn \r and \r\n into \n: send such text exactly
            return encode_event(base64.b64encode(el.data).decode("ascii"), el.id, "binary")
        return encode_event(text, el.id)

    @staticmethod
    def terminator(el: Element) -> bytes:
        return encode_event(terminator_text(el.data), el.id)

    @staticmethod
    def end(payload: dict[str, Any]) -> bytes:
        return encode_event(json.dumps(payload, ensure_ascii=False), event="end")

    @staticmethod
    def error(payload: dict[str, Any]) -> bytes:
        return encode_event(json.dumps(payload, ensure_ascii=False), event="error")


class _Msgpack:
    """Elements as a stream of msgpack maps `{id, data}`; nil objects are heartbeats."""

    headers: ClassVar[dict[str, str]] = {"Content-Type": MSGPACK}
    ping = msgpack.packb(None)

    @staticmethod
    def opened(name: str) -> bytes:
        return msgpack.packb(None)

    @staticmethod
    def element(el: Element) -> bytes:
        return msgpack.packb({"id": el.id, "data": el.data}, use_bin_type=True)

    @staticmethod
    def terminator(el: Element) -> bytes:
        return msgpack.packb({"id": el.id, "data": el.data, "end": "terminator"}, use_bin_type=True)

    @staticmethod
    def end(payload: dict[str, Any]) -> bytes:
        return msgpack.packb({"end": payload.pop("reason"), **payload}, use_bin_type=True)

    @staticmethod
    def error(payload: dict[str, Any]) -> bytes:
        return msgpack.packb({"error": payload}, use_bin_type=True)


def _format(accept: str | None) -> type[_SSE] | type[_Msgpack]:
    ranges = parse_accept(accept)
    if quality(ranges, MSGPACK, wildcards=False) > max(0.0, quality(ranges, "text/event-stream", wildcards=False)):
        return _Msgpack
    return _SSE


# -- subscribe -------------------------------------------------------------------------------
async def _subscribe(request: web.Request, name: str | None) -> web.StreamResponse:
    if name is None:
        raise BadRequestError("parameter X-Stream-Name (or ?stream=) is missing")
    name = validate_stream_name(name)
    key = qualify(stream_tenant(request), name)
    cfg = request.app[CONFIG].streams
    timeout_ms = _int_param(request, "X-Timeout-Ms", "timeout_ms", 0)
    idle = (cfg.subscribeTimeoutMs if timeout_ms is None else timeout_ms) / 1000
    expect = _int_param(request, "X-Expect-Num", "expect_num", 1)
    from_id = _int_param(request, "Last-Event-ID", "from_id", 0)
    asked_terminator = _param(request, "X-Stream-Terminator", "terminator")
    if asked_terminator == "":
        raise BadRequestError("parameter X-Stream-Terminator / terminator is empty")
    if asked_terminator is not None:
        try:
            asked_terminator.encode("utf-8")  # header bytes that are not UTF-8 arrive as surrogates
        except UnicodeEncodeError:
            raise BadRequestError("parameter X-Stream-Terminator / terminator is not UTF-8 text "
                                  "(write other bytes as \\xHH escapes)") from None
    fmt = _format(request.headers.get("Accept"))
    heartbeat = request.app[CONFIG].frontend.args.heartbeatSeconds
    sub = await request.app[BROKER].subscribe(key, from_id=from_id)
    open_subs = request.app.get(OPEN_SUBSCRIPTIONS) or OpenSubscriptions()
    open_subs.open.add(sub)
    try:
        out = EventStream(request, headers={"X-Stream-Name": name, **fmt.headers})
        await out.write(fmt.opened(name))
        if sub.lost is not None:
            first, last = sub.lost
            await out.write(fmt.error({"code": LOST_CODE, "lost_from_id": first, "lost_to_id": last,
                                       "message": f"ids {first}..{last} of stream {name!r} are no longer "
                                                  f"retained and were lost; continuing from id {last + 1}"}))
        await _pump(out, fmt, sub, idle, expect, heartbeat, asked_terminator, cfg.terminators, open_subs)
    finally:
        open_subs.open.discard(sub)
        await sub.close()
    return await out.finish()


async def _pump(out: EventStream, fmt: type[_SSE | _Msgpack], sub: AbstractSubscription, idle: float,
                expect: int | None, heartbeat: float, asked_terminator: str | None,
                config_terminators: list[str], open_subs: OpenSubscriptions) -> None:
    """Forward elements until a terminator, expect_num, the idle timeout or an error."""
    loop = asyncio.get_running_loop()
    stream_term: str | None = None
    terms = terminator_set([asked_terminator] if asked_terminator else config_terminators)
    sent = 0
    idle_deadline = loop.time() + idle if idle else None
    while True:
        wait = heartbeat if idle_deadline is None else max(0.0, min(heartbeat, idle_deadline - loop.time()))
        try:
            batch = await sub.next_batch(None if expect is None else expect - sent, wait)
        except SubscriptionEndedError as exc:
            if open_subs.shutting_down:
                await out.write(fmt.end({"reason": _SHUTDOWN, "last_id": sub.last_id,
                                         "message": "the server is shutting down; resume from last_id "
                                                    "(Last-Event-ID) on another node or after the restart"}))
            else:
                await out.write(fmt.error(exc.to_dict()))
            return
        except FunctionServiceError as exc:  # e.g. cluster mode with Redis unreachable: say so and end
            await out.write(fmt.error({**exc.to_dict(), "last_id": sub.last_id}))
            return
        if not batch:
            if idle_deadline is not None and loop.time() >= idle_deadline:
                await out.write(fmt.end({"reason": "idle_timeout", "last_id": sub.last_id,
                                         "message": f"no element for {idle * 1000:g} ms"}))
                return
            await out.write(fmt.ping)
            continue
        if asked_terminator is None and sub.stream_terminator != stream_term:
            stream_term = sub.stream_terminator  # set by a producer that attached after we subscribed
            terms = terminator_set([*config_terminators, *([stream_term] if stream_term else [])])
        chunks: list[bytes] = []
        done = False
        for el in batch:
            if el.data in terms:
                chunks.append(fmt.terminator(el))
                done = True
                break
            chunks.append(fmt.element(el))
            sent += 1
            if expect is not None and sent >= expect:
                chunks.append(fmt.end({"reason": "expect_num", "last_id": el.id,
                                       "message": f"received the {expect} elements asked for"}))
                done = True
                break
        await out.write(b"".join(chunks))
        if done:
            return
        if idle_deadline is not None:
            idle_deadline = loop.time() + idle


@routes.get("/serverless/v1/stream/subscribe")
async def subscribe(request: web.Request) -> web.StreamResponse:
    return await _subscribe(request, _param(request, "X-Stream-Name", "stream"))


# `[\s\S]+`, not `.+`: a name with a newline (%0A) is a bad name (400), not an unknown route (404).
@routes.get(r"/serverless/v1/streams/{name:[\s\S]+}")
async def subscribe_by_path(request: web.Request) -> web.StreamResponse:
    return await _subscribe(request, request.match_info["name"])


# -- publish, list, delete -------------------------------------------------------------------
# Made once: json.dumps with options builds an encoder per call, which cost more than the encoding.
_ELEMENT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _element_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return _ELEMENT_JSON(value).encode("utf-8")


def _refuse_count(count: int, limit: int) -> None:
    if count > limit:
        raise TooManyElementsError(f"{count if count > limit + 1 else 'more than ' + str(limit)} elements in "
                                   f"one publish; at most {limit} "
                                   "(streams.maxElementsPerPublish): send them in several requests; "
                                   "nothing was published")


def _refuse_ext(code: int, data: bytes) -> Any:
    raise BadRequestError(f"msgpack extension type {code} is not an element value; send str, bin, "
                          "numbers, booleans, arrays and maps with str keys")


def _msgpack_values(raw: bytes, max_elements: int, max_values: int) -> Any:
    """The msgpack body unpacked: a top-level array of more than `max_elements` (read from its
    header) and more than `max_values` values in all (each array and map and the items in it; no
    one array or map of more) are refused before (or as soon as) they are made, with the garbage
    collector paused."""
    head = raw[:1]
    if head in (b"\xdc", b"\xdd"):  # array 16 / array 32: the element count, before anything is unpacked
        _refuse_count(int.from_bytes(raw[1:3] if head == b"\xdc" else raw[1:5], "big"), max_elements)
    made = 0

    def counted(value: Any) -> Any:
        nonlocal made
        made += 1 + len(value)
        if made > max_values:
            raise BodyTooLargeError(f"body holds more than {max_values} values (arrays, maps and their items; "
                                    "frontend.args.maxBodyValues): send fewer per request")
        return value
    try:
        with safe_json.gc_paused():
            return msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_refuse_ext, timestamp=0,
                                   list_hook=counted, object_hook=counted,
                                   max_array_len=max_values, max_map_len=max_values)
    except ValueError as exc:
        if "exceeds max_" in str(exc):
            raise BodyTooLargeError(f"body holds an array or map of more than {max_values} items "
                                    "(frontend.args.maxBodyValues)") from None
        raise BadRequestError(f"body is not msgpack: {exc}") from None
    except msgpack.UnpackException as exc:
        raise BadRequestError(f"body is not msgpack: {exc}") from None


def parse_elements(raw: bytes, content_type: str, max_elements: int = 10000,
                   max_values: int = 100_000) -> list[bytes]:
    """A JSON array, NDJSON (one JSON value per line) or a msgpack array; strings are sent as
    their UTF-8 text, other JSON values as their JSON text, msgpack bin as is. More than
    `max_elements` is refused (413) before any element is encoded: each costs loop time; more
    than `max_values` values (arrays, objects, their elements and members) before it is parsed."""
    if content_type == MSGPACK:
        values = _msgpack_values(raw, max_elements, max_values)
        if not isinstance(values, list):
            raise BadRequestError("a msgpack body must be an array of elements")
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequestError("body is not UTF-8; send binary elements as msgpack "
                                  f"(Content-Type: {MSGPACK})") from None
        safe_json.check_values(raw, max_values, "body")
        try:
            whole = safe_json.loads(text, "body", max_items=max_elements)  # stops past max_elements
            values = whole if isinstance(whole, list) else [whole]
        except json.JSONDecodeError:
            values = []
            lines = text.splitlines()
            if len(lines) > max_elements:
                _refuse_count(sum(1 for line in lines if line.strip()), max_elements)
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    values.append(safe_json.loads(line, f"NDJSON line {n}"))
                except json.JSONDecodeError as exc:
                    raise BadRequestError(f"body is neither a JSON array nor NDJSON: line {n}: {exc.msg} "
                                          f"at column {exc.colno}") from None
    _refuse_count(len(values), max_elements)
    if not values:
        raise BadRequestError("no elements: send a JSON array, NDJSON or a msgpack array of elements")
    if any(v is None for v in values):
        raise BadRequestError("null is not an element")
    out = []
    for i, value in enumerate(values):
        try:
            out.append(_element_bytes(value))
        except RecursionError:  # a msgpack value nested deeper than json.dumps can encode
            raise BadRequestError(f"element {i} is nested too deeply to encode as JSON") from None
        except (TypeError, ValueError) as exc:  # bin map keys, timestamps, NaN, lone surrogates
            raise BadRequestError(f"element {i} cannot be sent as a stream element: {exc}") from None
    return out


def _publish_options(request: web.Request) -> StreamOptions | None:
    q = request.query
    policy = q.get("policy")
    if policy is not None and policy not in ("block", "cut"):
        raise BadRequestError(f"parameter policy must be 'block' or 'cut', got {policy[:40]!r}")
    terminator = q.get("terminator")
    if terminator == "":
        raise BadRequestError("parameter terminator is empty")
    values = {
        "retain_num": _int_param(request, None, "retain_num", 0),
        "retain_bytes": _int_param(request, None, "retain_bytes", 0),
        "retain_seconds": _float_param(request, "retain_seconds"),
        "retain_for_num_consumers": _int_param(request, None, "retain_for_num_consumers", 0),
    }
    if policy is None and terminator is None and all(v is None for v in values.values()):
        return None
    return StreamOptions(**{k: v for k, v in values.items() if v is not None}, policy=policy,  # type: ignore[arg-type]
                         terminator=terminator)


def _stats(tenant: str, stats: StreamStats) -> dict[str, Any]:
    return {**stats.to_dict(), "name": unqualify(tenant, stats.name)}


@routes.post(r"/serverless/v1/streams/{name:[\s\S]+}")
async def publish(request: web.Request) -> web.Response:
    name = validate_stream_name(request.match_info["name"])
    tenant = stream_tenant(request)
    key = qualify(tenant, name)
    options = _publish_options(request)
    timeout_ms = _int_param(request, "X-Timeout-Ms", "timeout_ms", 0)
    config = request.app[CONFIG]
    elements = parse_elements(await read_body(request), request.content_type, config.streams.maxElementsPerPublish,
                              config.frontend.args.maxBodyValues)
    broker = request.app[BROKER]
    broker.check_elements(elements)  # all or nothing: refuse before anything is published
    if options is not None:
        await broker.configure(key, options)
    ids = await broker.publish(key, elements, timeout=None if timeout_ms is None else timeout_ms / 1000)
    stats = await broker.stats(key)
    return web.json_response({"stream": name, "ids": ids, "stats": _stats(tenant, stats)})


@routes.get("/serverless/v1/streams")
async def list_streams(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    tenant = stream_tenant(request)
    one = request.query.get("stream")
    if one is not None:
        return web.json_response({"streams": [_stats(tenant, await broker.stats(qualify(tenant, one)))]})
    mine = [_stats(tenant, s) for s in await broker.list() if tenant_of(s.name) == tenant]
    return web.json_response({"streams": mine})


@routes.delete(r"/serverless/v1/streams/{name:[\s\S]+}")
async def delete_stream(request: web.Request) -> web.Response:
    name = validate_stream_name(request.match_info["name"])
    await request.app[BROKER].delete(qualify(stream_tenant(request), name))
    return web.json_response({"code": 0, "message": "SUCCESS", "deleted": name})
