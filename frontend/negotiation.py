"""`Accept` header parsing (RFC 9110 §12.5.1): media ranges with parameters and q-values."""
from __future__ import annotations

from typing import NamedTuple

__all__ = ("MediaRange", "parse_accept", "quality")


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
