"""W3C trace context (https://www.w3.org/TR/trace-context/): parse and make `traceparent` values.

In runtime/ because both the HTTP frontend and handler code (the upstream chat backend) need it;
fnstream's trace ids are already 32 lowercase hex digits, the shape W3C requires.
"""
from __future__ import annotations

import random
import re

__all__ = ("parse_traceparent", "make_traceparent", "is_w3c_trace_id", "new_span_id")

# Version 00 exactly, or a later version whose first four fields have the 00 layout (the spec
# tells parsers to read those and ignore what follows). Version ff is invalid.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a valid `traceparent` header, else None."""
    if not value:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return trace_id, span_id, flags


def is_w3c_trace_id(trace_id: str) -> bool:
    return trace_id != _ZERO_TRACE and _TRACE_ID.fullmatch(trace_id) is not None


def new_span_id() -> str:
    """A random non-zero 64-bit span id (not a secret: the module PRNG is enough)."""
    return "%016x" % (random.getrandbits(64) | 1)


def make_traceparent(trace_id: str, span_id: str | None = None, flags: str = "01") -> str | None:
    """A `traceparent` naming `trace_id` (None when it is not a W3C trace id, e.g. a custom X-Trace-Id)."""
    if not is_w3c_trace_id(trace_id):
        return None
    return f"00-{trace_id}-{span_id or new_span_id()}-{flags}"
