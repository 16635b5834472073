"""`Idempotency-Key`s in Redis (cluster mode): one key per (tenant, key), shared by every node,
so the same key sent to two frontends at once still makes one job.

`{prefix}:idem:{sha256}` holds `{"fp", "job", "claim", "rid", "until"}`. A claim names the id its
job will be made with (`rid`) from the start and lives as long as a bound key
(`jobs.idempotencySeconds`); `until` (Redis time, ms) ends its hold. The job's first save (the
job store's CREATE script, in the job's own slot) is the commit: it is refused once the id is
fenced (`{prefix}:{job:RID}:void`), and then binds the key (`job` set). So a node that dies
between the two leaves a claim that names a stored job: whoever asks next binds it and answers
that job. A claim past its hold whose job was never stored is taken over: its id is fenced first,
so a save still on its way is refused, never a second job beside the taker's. Claims, binds and
releases are scripts that compare the claim's value, so a node whose claim was taken cannot
overwrite another node's.
"""
from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from ..jobs.errors import JobStoreError
from ..jobs.key_store import KeyBind, KeyRecord, KeyStore, key_digest
from .job_scripts import VOID

__all__ = ("VOID_SECONDS", "RedisKeys")

log = logging.getLogger("fnstream.jobs")

VOID_SECONDS = 600  # a fenced job id stays refused this long: past any save still queued or resent

# KEYS: the key; ARGV: the new claim's value (JSON, without "until"), hold (ms), ttl (ms), the value
# to replace ('' for none). {'', the value stored} once claimed; else {the current value, now (ms)}.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[4] then return {current, tostring(now)} end
local claim = cjson.decode(ARGV[1])
claim['until'] = now + tonumber(ARGV[2])
local value = cjson.encode(claim)
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
return {'', value}
"""

# KEYS: the key; ARGV: the claim's value, the bound value, ttl (ms). 1 when the claim was still ours.
_BIND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

_STORED = "return redis.call('EXISTS', KEYS[1])"  # a script: refusals and outages raise as the others do

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisKeys(KeyStore):
    def __init__(self, redis: Any, prefix: str, seconds: float = 86400.0) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl = max(1, int(seconds * 1000))  # ms a claim, and a bound key, is kept
        # (digest, fingerprint) -> the value of this node's pending claim, and the job id it names
        self._claims: dict[tuple[str, str], str] = {}
        self._reserved: dict[tuple[str, str], str] = {}

    def _key(self, digest: str) -> str:
        return f"{self.prefix}:idem:{digest}"

    def _job_keys(self, job_id: str) -> tuple[str, str]:
        """The job's state key (runtime/cluster/job_store.py) and its fence, on the job's slot."""
        return f"{self.prefix}:{{job:{job_id}}}:state", f"{self.prefix}:{{job:{job_id}}}:void"

    async def _eval(self, script: str, keys: int, *args: Any) -> Any:
        try:
            return await self.redis.eval(script, keys, *args)
        except Exception as exc:  # Redis away or refusing: the submit is not taken (507, as other job writes)
            raise JobStoreError(f"the Redis job store refused an Idempotency-Key operation: {exc}") from None

    def reserve(self, tenant: str, key: str, fingerprint: str) -> str:
        return self._reserved.get((key_digest(tenant, key), fingerprint)) or super().reserve(tenant, key, fingerprint)

    async def claim(self, tenant: str, key: str, fingerprint: str, hold: float) -> KeyRecord | None:
        digest = key_digest(tenant, key)
        replace = ""
        while True:
            rid = str(uuid.uuid4())
            value = _dumps({"fp": fingerprint, "job": None, "claim": uuid.uuid4().hex, "rid": rid})
            first, second = await self._eval(_CLAIM, 1, self._key(digest), value, max(1, int(hold * 1000)),
                                             self.ttl, replace)
            if not first:
                self._claims[digest, fingerprint], self._reserved[digest, fingerprint] = _text(second), rid
                return None
            current = _text(first)
            record = json.loads(current)
            held = KeyRecord(str(record["fp"]), record["job"])
            if record["job"] is not None or "rid" not in record:  # bound; or a claim that names no id yet
                return held
            rid = str(record["rid"])
            state, fence = self._job_keys(rid)
            if not await self._eval(_STORED, 1, state):
                if int(_text(second)) < int(record["until"]):
                    return held  # still being stored
                if await self._eval(VOID, 2, state, fence, VOID_SECONDS):
                    replace = current  # past its hold and its job never stored (now fenced): take the key over
                    continue
            # stored: its submit died (or is slow) before it bound the key; the key names the job
            await self._eval(_BIND, 1, self._key(digest), current, _dumps({"fp": record["fp"], "job": rid}),
                             self.ttl)
            return KeyRecord(held.fingerprint, rid)

    async def bind(self, tenant: str, key: str, fingerprint: str, job_id: str, seconds: float) -> bool:
        digest = key_digest(tenant, key)
        value = self._claims.pop((digest, fingerprint), None)
        self._reserved.pop((digest, fingerprint), None)
        if value is None:
            return False
        bound = _dumps({"fp": fingerprint, "job": job_id})
        return bool(await self._eval(_BIND, 1, self._key(digest), value, bound, max(1, int(seconds * 1000))))

    async def bound(self, bind: KeyBind) -> None:
        """The job store's CREATE stored the job: the claim names it now. A failure here is logged:
        the claim already names the stored job by its id, so the next request binds it."""
        try:
            await self.bind(bind.tenant, bind.key, bind.fingerprint, bind.job_id, bind.seconds)
        except JobStoreError as exc:
            log.warning("jobs: job %s is stored; its Idempotency-Key is bound by the next request with it (%s)",
                        bind.job_id, exc.message)

    async def release(self, tenant: str, key: str, fingerprint: str) -> None:
        digest = key_digest(tenant, key)
        value = self._claims.pop((digest, fingerprint), None)
        rid = self._reserved.pop((digest, fingerprint), None)
        if value is None or rid is None:
            return
        state, fence = self._job_keys(rid)
        if not await self._eval(VOID, 2, state, fence, VOID_SECONDS):  # fenced: a save on its way is refused
            bound = _dumps({"fp": fingerprint, "job": rid})       # stored after all (a save that raced the
            await self._eval(_BIND, 1, self._key(digest), value, bound, self.ttl)  # failure): the key names it
            return
        await self._eval(_RELEASE, 1, self._key(digest), value)
