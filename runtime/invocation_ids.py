"""Invocation ids: the name by which a client reads or cancels an invocation again.

An invocation id is a capability (with it, and the right tenant, one reads the output back), so
it must not be guessable: 128 bits from the OS's CSPRNG, unlike trace ids (runtime/invocation.py
`new_trace_id`, a fast PRNG), which only name requests in logs. One `os.urandom` call costs well
under a microsecond: cheap enough for every call, JSON ones too.
"""
from __future__ import annotations

import os
import random
from binascii import b2a_base64

__all__ = ("new_invocation_id", "new_trace_id", "INVOCATION_ID_HEADER")

INVOCATION_ID_HEADER = "X-Invocation-Id"


_BATCH = 64  # ids made per read of the CSPRNG
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_ids: list[str] = []  # made, not yet given out: `pop` hands each to one caller, threads included


def new_invocation_id() -> str:
    """22 URL-safe characters holding 128 random bits (safe in paths, headers and stream names):
    `secrets.token_urlsafe(16)`, made `_BATCH` at a time from one `os.urandom` read (a system
    call and a base64 call per id were a tenth of a plain call's runtime work)."""
    try:
        return _ids.pop()
    except IndexError:
        pass
    raw = os.urandom(16 * _BATCH)
    batch = [b2a_base64(raw[i:i + 16], newline=False)[:22].translate(_URLSAFE).decode("ascii")
             for i in range(0, len(raw), 16)]
    mine = batch.pop()
    _ids.extend(batch)
    return mine


# A forked child must not hand out the ids its parent has made and may give out too.
os.register_at_fork(after_in_child=_ids.clear)


# The bits uuid4 fixes: version 4 and the RFC 4122 variant.
_V4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_V4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_trace_id() -> str:
    """A random id shaped like `uuid.uuid4().hex`, at a fraction of its cost on every request.

    Ids name requests in logs and headers; they are not secrets, so the (fork-safe) module PRNG
    is enough and no system call is needed.
    """
    return "%032x" % ((random.getrandbits(128) & _V4_CLEAR) | _V4_SET)
