"""Agreed terminators: the element that ends a subscription.

A terminator is written as text. Text containing `\\xHH` escapes also matches the raw bytes the
escapes spell, so openYuanrong's end marker `\\xE0\\xFF\\xE0\\xFF` ends a stream whether the
producer sent the 16-character text (what openYuanrong's frontend compares with) or the 4 bytes.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ("YUANRONG_END_MARKER", "terminator_forms", "terminator_set", "terminator_text")

YUANRONG_END_MARKER = r"\xE0\xFF\xE0\xFF"
_ESCAPE = re.compile(r"\\x([0-9A-Fa-f]{2})")


def terminator_forms(text: str) -> frozenset[bytes]:
    """The byte strings that `text` stands for: its UTF-8 form, and the decoded escapes if any."""
    forms = {text.encode("utf-8")}
    if _ESCAPE.search(text):
        try:
            raw = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text).encode("latin-1")
        except UnicodeEncodeError:  # other non-latin-1 characters: only the text form applies
            pass
        else:
            forms.add(raw)
    return frozenset(forms)


def terminator_set(texts: Iterable[str]) -> frozenset[bytes]:
    out: set[bytes] = set()
    for text in texts:
        out |= terminator_forms(text)
    return frozenset(out)


def terminator_text(data: bytes) -> str:
    """How a terminator element is shown in the final event: its text, or `\\xHH` escapes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02X}" for b in data)
