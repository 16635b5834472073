"""Invocation ids: the name by which a client reads or cancels an invocation again.

An invocation id is a capability (with it, and the right tenant, one reads the output back), so
it must not be guessable: 128 bits from the OS's CSPRNG, unlike trace ids (runtime/invocation.py
`new_trace_id`, a fast PRNG), which only name requests in logs. One `os.urandom` call costs well
under a microsecond: cheap enough for every call, JSON ones too.
"""
from __future__ import annotations

import random
from secrets import token_urlsafe

__all__ = ("new_invocation_id", "new_trace_id", "INVOCATION_ID_HEADER")

INVOCATION_ID_HEADER = "X-Invocation-Id"


def new_invocation_id() -> str:
    """22 URL-safe characters holding 128 random bits (safe in paths, headers and stream names)."""
    return token_urlsafe(16)


# The bits uuid4 fixes: version 4 and the RFC 4122 variant.
_V4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_V4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_trace_id() -> str:
    """A random id shaped like `uuid.uuid4().hex`, at a fraction of its cost on every request.

    Ids name requests in logs and headers; they are not secrets, so the (fork-safe) module PRNG
    is enough and no system call is needed.
    """
    return "%032x" % ((random.getrandbits(128) & _V4_CLEAR) | _V4_SET)
