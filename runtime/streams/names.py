"""Stream names: openYuanrong's character set and length limit, refused with a clear error."""
from __future__ import annotations

import re

from .errors import InvalidStreamNameError

__all__ = ("validate_stream_name", "MAX_STREAM_NAME_LENGTH", "MAX_QUALIFIED_NAME_LENGTH", "STREAM_NAME_CHARS")

MAX_STREAM_NAME_LENGTH = 255
# What brokers store: `<tenant>/<name>` (runtime/streams/tenancy.py; a tenant id is at most 63 characters).
MAX_QUALIFIED_NAME_LENGTH = 64 + MAX_STREAM_NAME_LENGTH
STREAM_NAME_CHARS = "a-z A-Z 0-9 ~ . - / _ ! @ # % ^ & * ( ) + = ; :"
_VALID = re.compile(r"[A-Za-z0-9~.\-/_!@#%^&*()+=;:]+")
_INVALID_CHAR = re.compile(r"[^A-Za-z0-9~.\-/_!@#%^&*()+=;:]")


def validate_stream_name(name: object, max_length: int = MAX_STREAM_NAME_LENGTH) -> str:
    """Return `name` if it is a valid stream name, else raise InvalidStreamNameError (400)."""
    if not isinstance(name, str) or not name:
        raise InvalidStreamNameError("stream name is missing or empty")
    if len(name) > max_length:
        raise InvalidStreamNameError(f"stream name is {len(name)} characters long; at most "
                                     f"{max_length} are allowed")
    if not _VALID.fullmatch(name):
        bad = _INVALID_CHAR.search(name)
        shown = repr(bad.group()) if bad else "?"
        raise InvalidStreamNameError(f"stream name {name[:64]!r} has the character {shown}; "
                                     f"allowed: {STREAM_NAME_CHARS}")
    return name
