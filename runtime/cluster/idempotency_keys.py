"""`Idempotency-Key`s in Redis (cluster mode): one key per (tenant, key), shared by every node,
so the same key sent to two frontends at once still makes one job.

`{prefix}:idem:{sha256}` holds `{"fp", "job", "claim"}`: a claim (`job` null) expires after
`hold` (a node that died mid-submit frees it), a bound key after `jobs.idempotencySeconds`.
Claims, binds and releases are scripts that compare the claim's random token, so a node whose
claim lapsed cannot overwrite another node's.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from ..jobs.errors import JobStoreError
from ..jobs.key_store import KeyRecord, KeyStore, key_digest

__all__ = ("RedisKeys",)

# KEYS: the key; ARGV: the claim's value, hold (ms). The current value, or nil once claimed.
_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""

# KEYS: the key; ARGV: the claim's value, the bound value, ttl (ms). 1 when the claim was still ours.
_BIND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class RedisKeys(KeyStore):
    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        # (digest, fingerprint) -> the value of this node's pending claim for that request: a bind or
        # release names its own claim, never a later one this node made for another request body.
        self._claims: dict[tuple[str, str], str] = {}

    def _key(self, digest: str) -> str:
        return f"{self.prefix}:idem:{digest}"

    async def _eval(self, script: str, *args: Any) -> Any:
        try:
            return await self.redis.eval(script, 1, *args)
        except Exception as exc:  # Redis away or refusing: the submit is not taken (507, as other job writes)
            raise JobStoreError(f"the Redis job store refused an Idempotency-Key operation: {exc}") from None

    async def claim(self, tenant: str, key: str, fingerprint: str, hold: float) -> KeyRecord | None:
        digest = key_digest(tenant, key)
        value = _dumps({"fp": fingerprint, "job": None, "claim": uuid.uuid4().hex})
        current = await self._eval(_CLAIM, self._key(digest), value, max(1, int(hold * 1000)))
        if current is None:
            self._claims[digest, fingerprint] = value
            return None
        record = json.loads(current)
        return KeyRecord(str(record["fp"]), record["job"])

    async def bind(self, tenant: str, key: str, fingerprint: str, job_id: str, seconds: float) -> bool:
        digest = key_digest(tenant, key)
        value = self._claims.pop((digest, fingerprint), None)
        if value is None:
            return False
        bound = _dumps({"fp": fingerprint, "job": job_id})
        return bool(await self._eval(_BIND, self._key(digest), value, bound, max(1, int(seconds * 1000))))

    async def release(self, tenant: str, key: str, fingerprint: str) -> None:
        digest = key_digest(tenant, key)
        value = self._claims.pop((digest, fingerprint), None)
        if value is not None:
            await self._eval(_RELEASE, self._key(digest), value)
