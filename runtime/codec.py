"""The JSON codec of invocation output, shared by the invocation, process and cluster workers, jobs
and the answer writers: payloads and writes encoded once (one compact encoder, built once), results
bounded, and `Item`, a generator item that keeps the value it was encoded from. A leaf: it imports
no invocation, so the worker side can use it without the invocation's graph."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Generator
from typing import Any

from .errors import ResponseTooLargeError, ResultNotSerializableError, StreamWriteError

__all__ = ("WRITTEN", "Item", "Written", "encode_json", "encode_payload", "encode_result", "encode_write")

_UNCHECKED_DEPTH = 10_000  # recursion the C stack (8 MB, threads' as the main one's) takes in any case


def _compact_json_encoder() -> Callable[[Any], str]:
    """`json.dumps(x, ensure_ascii=False, separators=(",", ":"), allow_nan=False)` (NaN is not JSON),
    made once: dumps with options builds a new encoder on every call, and even a kept JSONEncoder
    builds its C encoder on every `encode`. This one is built once, without a circular-reference
    check (its table of what is being encoded is state, and a failed encode leaves entries in it),
    so it is stateless and may be shared by threads; a cycle is stopped by the recursion limit
    instead. Unless a handler raised that limit (some libraries do): then the C stack could run out
    before it, and the checked encoder is used. Raises TypeError, ValueError or RecursionError for
    what is not JSON."""
    checked = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return checked

    def refuse(o: Any) -> Any:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    chunks = make(None, refuse, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    join = "".join
    depth = sys.getrecursionlimit

    def encode(value: Any) -> str:
        return join(chunks(value, 0)) if depth() <= _UNCHECKED_DEPTH else checked(value)
    return encode


_encode_compact = _compact_json_encoder()


def encode_payload(data: Any) -> str:
    """What a stream write carries: str as is, bytes as UTF-8, anything else JSON-encoded.

    Raises StreamWriteError at the write for what cannot go out: text with a lone surrogate
    (no UTF-8 encoding exists), NaN/Infinity (not JSON), objects JSON cannot encode.
    """
    if isinstance(data, str):
        text = data
    elif isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise StreamWriteError("stream write: bytes must be UTF-8 text") from None
    else:
        try:
            text = _encode_compact(data)
        except (TypeError, ValueError, RecursionError) as exc:
            raise StreamWriteError(f"stream write: {type(data).__name__} is not JSON-serializable: {exc}") from None
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise StreamWriteError(f"stream write: the text holds a lone surrogate at position {exc.start} "
                                   "and cannot be sent as UTF-8") from None
    return text


def encode_write(data: Any, max_write_size: int) -> str:
    """`encode_payload`, refusing a write larger than `max_write_size` bytes (StreamWriteError)."""
    payload = encode_payload(data)
    if len(payload) > max_write_size and len(payload.encode()) > max_write_size:
        raise StreamWriteError(f"stream write of {len(payload.encode())} bytes exceeds the limit of "
                               f"{max_write_size} bytes")
    return payload


def encode_json(value: Any) -> str:
    """A handler's result as compact JSON text (ResultNotSerializableError if it is not JSON).

    NaN/Infinity are not JSON, and a lone surrogate has no UTF-8 form: both are refused here,
    not mid-response.
    """
    try:
        text = _encode_compact(value)
        if not text.isascii():
            text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultNotSerializableError(f"the handler's result is not JSON-serializable: {exc}") from None
    return text


def encode_result(value: Any, max_size: int) -> str:
    """`encode_json`, refusing a result larger than `max_size` bytes (ResponseTooLargeError)."""
    text = encode_json(value)
    if len(text) > max_size and len(text.encode()) > max_size:
        raise ResponseTooLargeError(f"the handler's result exceeds {max_size} bytes")
    return text


class Written:
    """An already-finished awaitable: `await stream.write(x)` works whether or not it waited."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


WRITTEN = Written()


class Item(str):
    """A generator item in the channel of an invocation that keeps items (`keep_items`): its text,
    plus the value the handler yielded (a background job's output items are the values)."""

    value: Any

    @classmethod
    def of(cls, item: Any) -> Item:
        text = cls(encode_payload(item))
        text.value = text if isinstance(item, (str, bytes, bytearray, memoryview)) else item
        return text

    @classmethod
    def decoded(cls, text: str, is_json: bool) -> Item:
        """The item `of` made, again from its text: its value JSON-decoded, or the text itself
        (a cluster worker's write, relayed by the frontend)."""
        item = cls(text)
        item.value = json.loads(text) if is_json else item
        return item


