"""Standard Webhooks signatures (https://www.standardwebhooks.com): what lets a receiver tell
fnstream's deliveries from anyone else's POST to its public URL.

Each delivery carries `webhook-id` (the same on every attempt of one delivery, so a receiver
dedupes on it), `webhook-timestamp` (epoch seconds of this attempt: a receiver refuses old ones,
so a captured request cannot be replayed later) and `webhook-signature: v1,<base64 HMAC-SHA256
of "{id}.{timestamp}.{body}">`, one per secret, space-separated: while secrets rotate, a
receiver holding either the old or the new one verifies.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

__all__ = ("SECRET_PREFIX", "MIN_SECRET_BYTES", "decode_secret", "message_id", "signature_headers")

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24  # the spec's lower bound for a secret's key


def decode_secret(text: str) -> bytes:
    """The key of a `whsec_<base64>` secret; ValueError (never naming the secret) when malformed."""
    if not text.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret starts with {SECRET_PREFIX!r} followed by base64")
    try:
        key = base64.b64decode(text[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"a webhook secret is {SECRET_PREFIX!r} followed by base64 (standard alphabet, "
                         "padded)") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"a webhook secret's key must be at least {MIN_SECRET_BYTES} bytes (got {len(key)}); "
                         f"e.g. {SECRET_PREFIX} + base64 of 32 random bytes")
    return key


def message_id(job_id: str, run: int) -> str:
    """The delivery's `webhook-id`: one per end of a job (a retried job that ends again is a new
    message), the same for every attempt of it and on whichever node sends it."""
    return f"msg_{job_id.replace('-', '')}_{run}"


def signature_headers(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt (no signature header without keys)."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if keys:
        signed = f"{msg_id}.{timestamp}.".encode() + body
        headers["webhook-signature"] = " ".join(
            "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode() for key in keys)
    return headers
