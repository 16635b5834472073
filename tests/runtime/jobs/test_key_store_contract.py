"""The `Idempotency-Key` store contract (runtime/jobs/key_store.py KeyStore): one suite, run
against every implementation: memory (MemoryKeys), SQLite (SqliteKeys, in the job store's file)
and Redis (runtime/cluster/idempotency_keys.py RedisKeys, on a redis-server of the test's own,
and on a Redis Cluster).

A key is claimed, then bound to its job or released; whoever asks meanwhile is told who holds it;
claims and bound keys expire; keys are per tenant; of two writers claiming one key, one wins; a
write the store refuses raises JobStoreError; a durable store's bound keys outlive a restart.
How the keys serve a submit (waits, 409, 422, replays) is tests/frontend/jobs/test_idempotency.py.
"""
from __future__ import annotations

import asyncio

import pytest

from runtime.jobs import key_store
from runtime.jobs.errors import JobStoreError
from runtime.jobs.key_store import KeyRecord
from tests.support.waiting import eventually

HOUR = 3600.0


async def test_a_free_key_is_claimed_then_bound_and_named_to_later_callers(backend):
    keys = await backend.key_store()
    assert await keys.claim("t", "k", "fp1", HOUR) is None
    assert await keys.claim("t", "k", "fp2", HOUR) == KeyRecord("fp1", None)  # pending: still being stored
    assert await keys.bind("t", "k", "fp1", "job-1", HOUR)
    assert await keys.claim("t", "k", "fp1", HOUR) == KeyRecord("fp1", "job-1")
    assert await keys.claim("t", "k", "fp2", HOUR) == KeyRecord("fp1", "job-1")  # a different body: told whose


async def test_a_key_binds_once(backend):
    keys = await backend.key_store()
    assert await keys.claim("t", "k", "fp", HOUR) is None
    assert await keys.bind("t", "k", "fp", "job-1", HOUR)
    assert not await keys.bind("t", "k", "fp", "job-2", HOUR)  # no claim pending any more
    assert await keys.claim("t", "k", "fp", HOUR) == KeyRecord("fp", "job-1")


async def test_bind_needs_the_claim_it_names(backend):
    """Binding a key never claimed, or with another request's fingerprint, is refused."""
    keys = await backend.key_store()
    assert not await keys.bind("t", "never", "fp", "job-1", HOUR)
    assert await keys.claim("t", "k", "fp1", HOUR) is None
    assert not await keys.bind("t", "k", "fp2", "job-2", HOUR)
    assert await keys.claim("t", "k", "fp3", HOUR) == KeyRecord("fp1", None)  # the claim is untouched


async def test_release_frees_a_pending_claim_only(backend):
    keys = await backend.key_store()
    assert await keys.claim("t", "k", "fp1", HOUR) is None
    await keys.release("t", "k", "fp1")
    assert await keys.claim("t", "k", "fp2", HOUR) is None  # free again: a corrected request takes it
    await keys.release("t", "k", "fp1")                     # not fp1's claim: kept
    assert await keys.claim("t", "k", "fp3", HOUR) == KeyRecord("fp2", None)
    assert await keys.bind("t", "k", "fp2", "job-2", HOUR)
    await keys.release("t", "k", "fp2")                     # bound: a release changes nothing
    assert await keys.claim("t", "k", "fp4", HOUR) == KeyRecord("fp2", "job-2")


async def test_keys_are_per_tenant(backend):
    keys = await backend.key_store()
    assert await keys.claim("acme", "k", "fp-a", HOUR) is None
    assert await keys.claim("other", "k", "fp-b", HOUR) is None  # the same key, another tenant: free
    assert await keys.bind("acme", "k", "fp-a", "job-a", HOUR)
    assert await keys.bind("other", "k", "fp-b", "job-b", HOUR)
    assert await keys.claim("acme", "k", "x", HOUR) == KeyRecord("fp-a", "job-a")
    assert await keys.claim("other", "k", "x", HOUR) == KeyRecord("fp-b", "job-b")


async def test_a_pending_claim_expires_after_its_hold(backend):
    """A claim whose submit never ended (its node died) frees the key after `hold`."""
    keys = await backend.key_store()
    assert await keys.claim("t", "k", "fp1", 0.05) is None
    assert await eventually(lambda: _claims(keys, "fp2"), "the claim to expire", accept=lambda r: r is None) is None
    assert await keys.claim("t", "k", "fp3", HOUR) == KeyRecord("fp2", None)


async def test_a_bound_key_expires_after_its_seconds(backend):
    keys = await backend.key_store()
    assert await keys.claim("t", "k", "fp1", HOUR) is None
    assert await keys.bind("t", "k", "fp1", "job-1", 0.05)
    assert await eventually(lambda: _claims(keys, "fp2"), "the key to expire", accept=lambda r: r is None) is None
    assert not await keys.bind("t", "k", "fp1", "job-1", HOUR)  # the old request's claim is gone


async def test_expired_keys_are_purged(backend, monkeypatch):
    """Expired keys do not pile up in the store (Redis expires them itself; the others purge)."""
    monkeypatch.setattr(key_store, "PURGE_EVERY", 0.0)
    keys = await backend.key_store()
    for n in range(50):
        assert await keys.claim("t", f"k{n}", "fp", HOUR) is None
        assert await keys.bind("t", f"k{n}", "fp", f"job-{n}", 0.001)
    await asyncio.sleep(0.01)  # past every key's expiry
    assert await keys.claim("t", "fresh", "fp", HOUR) is None  # purges the expired ones on its way
    assert await backend.stored_keys() == 1


async def test_of_two_writers_claiming_one_key_exactly_one_wins(backend):
    """Two frontends (Redis: two clients) claim the same key at once, many times over."""
    first, second = await backend.key_store(), await backend.key_store()
    for n in range(20):
        claims = await asyncio.gather(*(keys.claim("t", f"k{n}", f"fp-{i}", HOUR)
                                        for i, keys in enumerate([first, second] * 3)))
        winners = [i for i, record in enumerate(claims) if record is None]
        assert len(winners) == 1, claims
        assert {r.fingerprint for r in claims if r is not None} == {f"fp-{winners[0]}"}


async def test_a_refused_write_raises(backend):
    """A full disk or a full Redis: the claim raises JobStoreError (the submit is 507), never a
    silent None that would let two requests make two jobs."""
    keys = await backend.key_store()
    assert await keys.claim("t", "held", "fp", HOUR) is None
    await backend.refuse_writes()
    with pytest.raises(JobStoreError):
        await keys.claim("t", "k", "fp", HOUR)
    with pytest.raises(JobStoreError):
        await keys.bind("t", "held", "fp", "job-1", HOUR)
    await backend.take_writes()
    assert await keys.claim("t", "k", "fp", HOUR) is None


async def test_a_durable_store_keeps_bound_keys_and_forgets_pending_claims_over_a_restart(backend):
    if not backend.durable:
        pytest.skip("the memory store's keys end with the process")
    keys = await backend.key_store()
    assert await keys.claim("t", "bound", "fp", HOUR) is None
    assert await keys.bind("t", "bound", "fp", "job-1", HOUR)
    assert await keys.claim("t", "pending", "fp", HOUR) is None
    keys = await backend.reopen_keys()
    assert await keys.claim("t", "bound", "other", HOUR) == KeyRecord("fp", "job-1")
    pending = await keys.claim("t", "pending", "other", HOUR)
    if backend.kind == "sqlite":  # one server per file: its pending claims died with it
        assert pending is None
    else:  # shared by live nodes: another node's claim is theirs until its hold runs out
        assert pending == KeyRecord("fp", None)


async def _claims(keys, fingerprint):
    return await keys.claim("t", "k", fingerprint, HOUR)
