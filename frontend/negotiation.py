"""`Accept` header parsing (RFC 9110 §12.5.1): media ranges with parameters and q-values; and
how an invoke answers (JSON or SSE) as its Accept asks."""
from __future__ import annotations

import functools
from typing import NamedTuple

from runtime.errors import NotAcceptableError
from runtime.surface import Mode

__all__ = ("MediaRange", "parse_accept", "quality", "negotiate_mode")


class MediaRange(NamedTuple):
    type: str
    subtype: str
    q: float


def parse_accept(header: str | None) -> list[MediaRange]:
    if not header:
        return [MediaRange("*", "*", 1.0)]
    ranges = []
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if "/" not in media:
            continue
        mtype, _, subtype = media.partition("/")
        q = 1.0
        for param in fields[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = max(0.0, min(1.0, float(value.strip())))
                except ValueError:
                    q = 0.0
        ranges.append(MediaRange(mtype.strip(), subtype.strip(), q))
    return ranges


def quality(ranges: list[MediaRange], media_type: str, *, wildcards: bool = True,
            unmentioned: float = 0.0) -> float:
    """The q-value the client gives `media_type`; the most specific matching range wins.

    `unmentioned` is returned when no range matches (to tell "not listed" from "refused", q=0).
    """
    mtype, _, subtype = media_type.partition("/")
    best_specificity, best_q = -1, 0.0
    for r in ranges:
        if r.type == mtype and r.subtype == subtype:
            specificity = 2
        elif wildcards and r.type == mtype and r.subtype == "*":
            specificity = 1
        elif wildcards and r.type == "*" and r.subtype == "*":
            specificity = 0
        else:
            continue
        if specificity > best_specificity or (specificity == best_specificity and r.q > best_q):
            best_specificity, best_q = specificity, r.q
    return best_q if best_specificity >= 0 else unmentioned



@functools.lru_cache(maxsize=256)  # clients send a handful of distinct Accept headers
def negotiate_mode(accept: str | None, enable_event: bool) -> Mode:
    """'sse' or 'json' from the Accept header.

    406 when only SSE is acceptable but disabled, or when JSON is refused outright (q=0) and SSE
    is not asked for; an Accept that merely lists other types still gets JSON (lenient).
    """
    ranges = parse_accept(accept)
    q_sse = quality(ranges, "text/event-stream", wildcards=False)
    q_json = quality(ranges, "application/json", unmentioned=-1.0)
    if q_sse > 0 and q_sse >= q_json:
        if enable_event:
            return "sse"
        if q_json > 0:
            return "json"
        raise NotAcceptableError("Server-Sent Events are disabled (set frontend.args.enableEvent: true); "
                                 "this request accepts only text/event-stream")
    if q_json == 0:
        raise NotAcceptableError("this request refuses application/json (q=0) and does not accept "
                                 "text/event-stream; those are the only answers")
    return "json"
