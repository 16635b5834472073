"""Parsing untrusted JSON: every hostile input becomes a BadRequestError (400), never a 500.

On top of `json.loads`: integers over Python's 4300-digit limit, `NaN`/`Infinity` and floats
that overflow to infinity (not JSON, and they could never be sent back as JSON), strings holding
a lone surrogate escape (`"\\ud800"`, which no UTF-8 text can carry) and nesting deeper than the
parser's recursion limit.

One body may not hold the event loop for long: a body of more than `max_values` values
(`frontend.args.maxBodyValues`: arrays, objects and their elements and members, scalars too) is
refused (413) before it is parsed, counted as its `,`, `[` and `{` outside strings (a byte count,
then a scan that skips the strings, only when that count is over the limit, stopping past it).
Every value costs loop time to parse and again each time the job store encodes it (a 4 MB body
of 2 M `1`: ~0.2 s of CPU per encode and parse, held the loop ~1 s per /v2 job). A large body is parsed with the
garbage collector paused: its passes over millions of new lists and dicts were most of the
parse's CPU (a 4.2 MB body of 1.4 M `[]`: 0.45 s, 0.09 s with the collector paused).
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from runtime.errors import BadRequestError, BodyTooLargeError

__all__ = ("loads", "has_lone_surrogate", "check_values", "gc_paused", "LARGE_BODY")

# Only a body containing a `\uD8xx`..`\uDFxx` escape can yield a surrogate: the walk below is skipped otherwise.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_MAX_WALK_DEPTH = 10_000


# Bodies from this size on are parsed with the garbage collector paused (below it a parse makes
# too few containers for the collector to matter).
LARGE_BODY = 64 * 1024
# A string (matched whole, so that what it holds is skipped) or a separator outside strings.
# After `_without_escapes`, a string is a quote, anything but a quote, and a quote, or the end of
# the text for one never closed: every match that starts at a quote succeeds without backtracking,
# so the scan is linear whatever the body (the escape-aware pattern this replaces retried from
# each escaped quote of a string that never closed: quadratic, 10 s for a 115 KB body).
_TOKEN = re.compile(rb'"[^"]*(?:"|\Z)|([,\[{])')
_TOKEN_TEXT = re.compile(r'"[^"]*(?:"|\Z)|([,\[{])')


def _separators(data: bytes | str) -> int:
    if isinstance(data, str):
        return data.count(",") + data.count("[") + data.count("{")
    return data.count(b",") + data.count(b"[") + data.count(b"{")


def _without_escapes(data: bytes | str) -> bytes | str:
    """`data` with its escaped backslashes, then its escaped quotes, taken out: JSON reads an
    escape as a pair from left to right, so what is left has a quote only where a string opens or
    closes. (Two C passes; the separators outside strings stay where they were.)"""
    if isinstance(data, str):
        return data.replace("\\\\", "").replace('\\"', "")
    return data.replace(b"\\\\", b"").replace(b'\\"', b"")


def _separators_outside_strings(data: bytes | str, limit: int) -> int:
    """The `,` `[` `{` outside strings, counted no further than `limit` + 1: a body of a million
    short strings is refused after about `limit` of them (stripping them all with a regex took
    0.25 s for 1.4 M `""`)."""
    text = _without_escapes(data)
    tokens = _TOKEN_TEXT.finditer(text) if isinstance(text, str) else _TOKEN.finditer(text)
    count = 0
    for match in tokens:
        if match.lastindex:  # a separator, not a string
            count += 1
            if count > limit:
                break
    return count


def check_values(data: bytes | str, limit: int | None, what: str = "request body") -> None:
    """413 when `data` (JSON text, NDJSON too) holds more than `limit` values, before any of it is
    parsed: counted as its `,`, `[` and `{` outside strings (every array and object, and every
    element or member after a container's first). A byte count first; only a body over the limit
    by that count is read for its strings. None: no limit."""
    if limit is None or len(data) <= limit or _separators(data) <= limit:
        return
    count = _separators_outside_strings(data, limit)
    if count > limit:
        raise BodyTooLargeError(f"{what} holds more than {limit} values (arrays, objects and their elements "
                                "and members; frontend.args.maxBodyValues): send fewer, or larger values, "
                                "per request")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The garbage collector off while a large body becomes objects (restored after; it stays off
    if it was)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequestError(f"the number {text[:40]} is too large for a float; send finite numbers only")
    return value


def _refuse_constant(name: str) -> Any:
    raise BadRequestError(f"{name} is not a JSON number; send finite numbers only")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)  # stateless: shareable


def has_lone_surrogate(value: Any, depth: int = 0) -> bool:
    """True if a string (or key) anywhere in `value` holds a surrogate code point."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if depth > _MAX_WALK_DEPTH:
        return False
    if isinstance(value, list):
        return any(has_lone_surrogate(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(has_lone_surrogate(k, depth + 1) or has_lone_surrogate(v, depth + 1) for k, v in value.items())
    return False


# The scanner the decoder made (its C one); typeshed does not list the attribute.
_scan_once: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_OPENERS = (b"{", b"[")
_JSON_SPACE = " \t\n\r"


_SPACE = re.compile(r"[ \t\n\r]*")


def _array_items(text: str, limit: int) -> list[Any] | None:
    """`text` as a lone JSON array, read item by item and stopped after `limit` + 1 items (the
    caller refuses that many before the rest is parsed); None when it is not one (the caller's
    parse says why, or reads NDJSON)."""
    pos = _SPACE.match(text).end()  # type: ignore[union-attr]  # (matches the empty string)
    if text[pos:pos + 1] != "[":
        return None
    pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
    items: list[Any] = []
    if text[pos:pos + 1] != "]":
        while True:
            try:
                value, pos = _scan_once(text, pos)
            except StopIteration:
                return None
            items.append(value)
            if len(items) > limit:
                return items
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
            if text[pos:pos + 1] != ",":
                break
            pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
        if text[pos:pos + 1] != "]":
            return None
    return items if not text[pos + 1:].strip(_JSON_SPACE) else None


def _decode(text: str, max_items: int | None = None) -> Any:
    """`_DECODER.decode(text)`; a value that starts at the first character and is followed by
    nothing but whitespace is scanned at once (decode's whitespace regexes and method calls are
    most of what a small body costs). Anything else goes through decode, which raises its errors.
    With `max_items`, an array is read item by item and stops past that many (`_array_items`)."""
    if max_items is not None:
        items = _array_items(text, max_items)
        if items is not None:
            return items
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:  # no value at the first character: leading whitespace, or an empty text
        return _DECODER.decode(text)
    if end == len(text) or not text[end:].strip(_JSON_SPACE):
        return value
    return _DECODER.decode(text)  # "Extra data"


def loads(raw: bytes | str, what: str = "request body", max_values: int | None = None,
          max_items: int | None = None) -> Any:
    """Parse JSON text; raise BadRequestError with a message naming `what` and the problem, and
    BodyTooLargeError (413) past `max_values` values (`check_values`). With
    `max_items`, a top-level array is parsed no further than `max_items` + 1 items (the caller
    refuses a list that long).

    json.JSONDecodeError is let through (callers word its position their own way).
    """
    check_values(raw, max_values, what)
    if len(raw) < LARGE_BODY:
        return _loads(raw, what, max_items)
    with gc_paused():
        return _loads(raw, what, max_items)


def _loads(raw: bytes | str, what: str, max_items: int | None) -> Any:
    try:
        # What json.loads does (bytes: detect UTF-8/16/32), with a decoder made once: loads with
        # options builds a new one on every call.
        if isinstance(raw, str):
            if raw.startswith("\ufeff"):
                raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", raw, 0)
            text = raw
        else:  # a body that opens an object or array, and no NUL after it (UTF-16/32-LE), is UTF-8
            utf8 = raw[:1] in _OPENERS and raw[1:2] != b"\x00"
            text = raw.decode("utf-8" if utf8 else json.detect_encoding(raw), "surrogatepass")
        value = _decode(text, max_items)
    except json.JSONDecodeError:
        raise
    except UnicodeDecodeError:
        raise BadRequestError(f"{what} is not UTF-8 JSON") from None
    except RecursionError:
        raise BadRequestError(f"{what} is JSON nested too deeply") from None
    except BadRequestError as exc:
        raise BadRequestError(f"{what}: {exc.message}") from None
    except ValueError as exc:  # an integer over sys.get_int_max_str_digits() digits
        raise BadRequestError(f"{what} is not acceptable JSON: {exc}") from None
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if _SURROGATE_ESCAPE.search(data) and has_lone_surrogate(value):
        raise BadRequestError(f"{what} holds a lone surrogate escape (e.g. \"\\ud800\"); "
                              "JSON strings must be valid Unicode text")
    return value
