"""The job store contract: one suite, run against every store fnstream ships (`jobs.store`:
memory, sqlite, redis), through the job manager a serving node builds over it (runtime/node.py),
without HTTP; the Redis store in cluster mode on a redis-server of the test's own, and on a
Redis Cluster.

Whatever the store, a job is created stored (IN_QUEUE), read back, changed (cancel, retry) and
deleted when its retention is over; it ends in each final state with its output items in order;
listings are newest first and a tenant sees only its own jobs; concurrent submits each make one
job; a write the store refuses raises JobStoreError (the submit is 507) and leaves no job behind;
and a durable store (SQLite, Redis) gives every job back, as it was, to the node started after it.
The store-level rules only one kind has (SQLite's stubs and lock, Redis's fences and takeover)
are tested beside it: tests/frontend/jobs/, tests/runtime/cluster/test_cluster_jobs.py.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from runtime.errors import ConfigError
from runtime.jobs.errors import JobNotFoundError, JobStateError, JobStoreError
from runtime.jobs.model import Job, JobRequest
from runtime.jobs.runner import JobManager
from runtime.jobs.store import SharedStore
from runtime.manifest import FunctionSpec
from runtime.node import Node
from runtime.principal import Principal
from tests.support.servers import HANDLERS, fn
from tests.support.waiting import eventually

FUNCTIONS = [fn("echo", "job_fns.echo"), fn("acme-echo", "job_fns.echo", tenant="acme"),
             fn("count", "job_fns.count", concurrency=4), fn("raises", "job_fns.raises"),
             fn("sleeper", "job_fns.sleeper", concurrency=1)]
USER = Principal("default", "user")
ACME = Principal("acme", "user")
RUNPOD = JobRequest(api="runpod")

StartNode = Callable[..., Awaitable[Node]]


@pytest.fixture
async def start_node(backend, deploy_dir) -> AsyncIterator[StartNode]:
    """Factory: a running serving node whose job store is the backend's kind, on its place."""
    deploy = deploy_dir(*FUNCTIONS)
    running: list[Node] = []

    async def start(**overrides: Any) -> Node:
        node = Node(backend.node_config(deploy, **overrides))
        await node.__aenter__()
        running.append(node)
        return node

    yield start
    for node in reversed(running):
        await stop(node)


async def stop(node: Node) -> None:
    if not node.lifecycle._closed:
        await node.__aexit__(None, None, None)


def jobs_of(node: Node) -> JobManager:
    assert node.jobs is not None
    return node.jobs


async def submit(node: Node, function: str, payload: Any = None, principal: Principal = USER,
                 request: JobRequest = RUNPOD) -> Job:
    return await node.dispatcher.submit_job(principal, function, {"input": payload or {}}, request)


async def finished(node: Node, job: Job) -> Job:
    await jobs_of(node).wait(job, 30)
    assert job.final, job
    return job


async def test_a_job_is_stored_read_back_and_completes(start_node):
    node = await start_node()
    job = await submit(node, "echo", {"x": 1})
    assert job.status in ("IN_QUEUE", "IN_PROGRESS")
    assert (await jobs_of(node).lookup(job.id, USER)).id == job.id
    await finished(node, job)
    assert (job.status, job.status_code) == ("COMPLETED", 200)
    assert job.result == {"job_id": job.id, "input": {"x": 1}}
    read = await jobs_of(node).lookup(job.id, USER)
    assert (read.status, read.result) == ("COMPLETED", job.result)


async def test_output_items_keep_their_order(start_node):
    node = await start_node()
    job = await finished(node, await submit(node, "count", {"n": 30}))
    assert job.status == "COMPLETED"
    assert [item["i"] for item in job.outputs] == list(range(30))
    assert [item["i"] for item in (await jobs_of(node).lookup(job.id, USER)).outputs] == list(range(30))


async def test_each_final_state_is_stored(start_node):
    """COMPLETED, FAILED (the handler raised), TIMED_OUT (its execution timeout), CANCELLED
    (running, and queued): what the node shows, and (durable stores) what the next node reads."""
    node = await start_node()
    manager = jobs_of(node)
    done = await submit(node, "echo")
    failed = await submit(node, "raises")
    timed_out = await submit(node, "sleeper", {"seconds": 30}, request=JobRequest(api="runpod",
                                                                                   execution_timeout=0.1))
    await finished(node, timed_out)
    running = await submit(node, "sleeper", {"seconds": 30})
    queued = await submit(node, "sleeper", {"seconds": 30})  # concurrency 1: waits behind `running`
    await eventually(lambda: running.status == "IN_PROGRESS", "the sleeper to start")
    assert queued.status == "IN_QUEUE"
    await manager.cancel(queued)
    await manager.cancel(running)
    want = {done.id: "COMPLETED", failed.id: "FAILED", timed_out.id: "TIMED_OUT", running.id: "CANCELLED",
            queued.id: "CANCELLED"}
    for job in (done, failed, running, queued):
        await finished(node, job)
    assert {j.id: j.status for j in (done, failed, timed_out, running, queued)} == want
    assert failed.error is not None and "no widgets" in failed.error["message"]
    with pytest.raises(JobStateError):
        await manager.cancel(done)  # final: 409
    await stop(node)
    if node.store is not None and not node.store.durable:
        return
    again = jobs_of(await start_node())
    assert {i: (await again.lookup(i, USER)).status for i in want} == want


async def test_a_failed_job_is_retried_with_fresh_output(start_node):
    node = await start_node()
    manager = jobs_of(node)
    job = await finished(node, await submit(node, "raises"))
    assert job.status == "FAILED"
    await manager.retry(job)
    await finished(node, job)
    assert (job.status, job.retried) == ("FAILED", 1)
    assert (await manager.lookup(job.id, USER)).retried == 1
    with pytest.raises(JobStateError):
        await manager.retry(await finished(node, await submit(node, "echo")))  # COMPLETED: 409


async def test_listings_are_newest_first_and_per_tenant(start_node):
    node = await start_node()
    manager = jobs_of(node)
    mine = [await submit(node, "echo", {"n": n}) for n in range(3)]
    theirs = await submit(node, "acme-echo", principal=ACME)
    counted = await submit(node, "count", {"n": 1})
    for job in (*mine, theirs, counted):
        await finished(node, job)
    listed = [j.id for j in await manager.list_all(USER)]
    assert listed == [j.id for j in sorted((*mine, counted), key=lambda j: j.created_at, reverse=True)]
    assert [j.id for j in await manager.list_all(USER, function="count")] == [counted.id]
    assert [j.id for j in await manager.list_all(ACME)] == [theirs.id]
    assert [j.id for j in await manager.list_all(USER, limit=2)] == listed[:2]


async def test_a_tenant_never_reads_another_tenants_job(start_node):
    node = await start_node()
    manager = jobs_of(node)
    theirs = await finished(node, await submit(node, "acme-echo", principal=ACME))
    with pytest.raises(JobNotFoundError):
        await manager.lookup(theirs.id, USER)  # as for an unknown id
    with pytest.raises(JobNotFoundError):
        await manager.lookup("no-such-job", USER)
    assert (await manager.lookup(theirs.id, ACME)).status == "COMPLETED"


async def test_finished_jobs_are_deleted_after_their_retention(start_node):
    node = await start_node()
    manager = jobs_of(node)
    old = await finished(node, await submit(node, "count", {"n": 2}))
    running = await submit(node, "sleeper", {"seconds": 30})
    await eventually(lambda: running.status == "IN_PROGRESS", "the sleeper to start")
    later = time.time() + manager.config.retentionSeconds + 1
    assert await manager.expire(now=later) == 1  # only the finished one
    with pytest.raises(JobNotFoundError):
        await manager.lookup(old.id, USER)
    assert (await manager.lookup(running.id, USER)).status == "IN_PROGRESS"
    assert old.id not in [j.id for j in await manager.list_all(USER)]
    await stop(node)
    if node.store is not None and node.store.durable:  # deleted from the store too
        again = jobs_of(await start_node())
        with pytest.raises(JobNotFoundError):
            await again.lookup(old.id, USER)


async def test_the_sweeper_forgets_finished_jobs_once_their_retention_is_over(backend, start_node):
    """No call to expire(): the node's own sweep (and Redis's key expiry) ends a finished job."""
    node = await start_node(**{"jobs.retentionSeconds": 1})
    manager = jobs_of(node)
    done = await finished(node, await submit(node, "echo"))

    async def gone() -> bool:
        try:
            await manager.lookup(done.id, USER)
        except JobNotFoundError:
            return True
        return False

    await eventually(gone, "the finished job to expire")
    assert done.id not in [j.id for j in await manager.list_all(USER)]
    await stop(node)
    if backend.durable:
        again = jobs_of(await start_node(**{"jobs.retentionSeconds": 1}))
        with pytest.raises(JobNotFoundError):
            await again.lookup(done.id, USER)


async def test_concurrent_submits_each_make_one_job(start_node):
    node = await start_node()
    manager = jobs_of(node)
    jobs = await asyncio.gather(*(submit(node, "echo", {"n": n}) for n in range(40)))
    assert len({j.id for j in jobs}) == 40
    for job in jobs:
        await finished(node, job)
    assert {j.result["input"]["n"] for j in jobs} == set(range(40))
    assert {j.id for j in await manager.list_all(USER)} == {j.id for j in jobs}


async def test_a_second_node_on_the_store_shares_it_or_is_refused(backend, start_node):
    """Two writers: Redis is shared by every node (each lists and reads the other's jobs); an
    SQLite file has one server (a second is refused at start); memory is each node's own."""
    first = await start_node()
    if backend.kind == "sqlite":
        with pytest.raises(ConfigError, match="in use by another fnstream server"):
            await start_node()
        return
    second = await start_node()
    a, b = await asyncio.gather(submit(first, "echo", {"on": "a"}), submit(second, "echo", {"on": "b"}))
    await finished(first, a)
    await finished(second, b)
    if backend.kind == "memory":
        with pytest.raises(JobNotFoundError):
            await jobs_of(first).lookup(b.id, USER)
        return
    theirs = await finished(first, await submit(first, "acme-echo", principal=ACME))
    assert (await jobs_of(first).lookup(b.id, USER)).result == b.result
    assert (await jobs_of(second).lookup(a.id, USER)).result == a.result
    for node in (first, second):
        assert {j.id for j in await jobs_of(node).list_all(USER)} == {a.id, b.id}
        assert [j.id for j in await jobs_of(node).list_all(ACME)] == [theirs.id]  # the tenant's only
    with pytest.raises(JobNotFoundError):
        await jobs_of(second).lookup(theirs.id, USER)


async def test_a_refused_write_fails_the_submit_and_leaves_no_job(backend, start_node):
    node = await start_node()
    manager = jobs_of(node)
    kept = await finished(node, await submit(node, "echo"))
    await backend.refuse_writes(node.store)
    with pytest.raises(JobStoreError):
        await submit(node, "echo")
    assert [j.id for j in manager.list_jobs(USER)] == [kept.id]
    assert manager.queued == 0
    await backend.take_writes(node.store)
    assert (await finished(node, await submit(node, "echo"))).status == "COMPLETED"


async def test_a_durable_store_gives_every_job_back_to_the_next_node(backend, start_node):
    node = await start_node()
    done = await finished(node, await submit(node, "count", {"n": 5}))
    theirs = await finished(node, await submit(node, "acme-echo", principal=ACME))
    await stop(node)
    manager = jobs_of(await start_node())
    if not backend.durable:
        with pytest.raises(JobNotFoundError):
            await manager.lookup(done.id, USER)
        return
    read = await manager.lookup(done.id, USER)
    assert (read.status, read.function, read.tenant, read.created_at) == ("COMPLETED", "count", "default",
                                                                           done.created_at)
    assert read.outputs == done.outputs and read.result == done.result
    assert [j.id for j in await manager.list_all(ACME)] == [theirs.id]
    assert done.id in [j.id for j in await manager.list_all(USER)]


async def test_the_stream_cursor_returns_each_item_once(backend, start_node):
    """RunPod's /stream: each output item is returned once, and (durable stores) not again by the
    node started after this one."""
    node = await start_node()
    manager = jobs_of(node)
    job = await finished(node, await submit(node, "count", {"n": 4}))
    first = await manager.advance_stream(job)
    assert [item["i"] for item in first] == [0, 1, 2, 3]
    assert await manager.advance_stream(job) == []
    await stop(node)
    if not backend.durable:
        return
    again = jobs_of(await start_node())
    assert await again.advance_stream(await again.lookup(job.id, USER)) == []


async def read_back(store: Any, job_id: str) -> Job | None:
    """The job as a durable store holds it: SQLite's read_job, a shared store's fetch."""
    return await (store.fetch(job_id) if isinstance(store, SharedStore) else store.read_job(job_id))


async def test_each_write_a_store_refuses_raises(backend):
    """At the store itself: a refused save or output write fails its future with JobStoreError
    (the runner then retries or fails the job), and writes after it go through once it takes
    them again: none is dropped in silence."""
    store = await backend.job_store()
    job = Job(id="j1", function="f", tenant="t", event={"x": 1}, status="IN_PROGRESS")
    await store.save(job)
    await backend.refuse_writes(store)
    job.status = "COMPLETED"
    with pytest.raises(JobStoreError):
        await store.save(job)
    with pytest.raises(JobStoreError):
        await store.add_outputs("j1", 1, ["a"], 1)
    await backend.take_writes(store)
    await store.add_outputs("j1", 1, ["a", "b"], 2)
    await store.save(job)
    stored = await read_back(store, "j1")
    assert stored is not None and (stored.status, stored.outputs) == ("COMPLETED", ["a", "b"])


async def test_output_writes_keep_order_and_a_resent_one_is_not_doubled(backend):
    """At the store itself (durable ones): items in index order however they were batched, a
    batch written again (its reply lost) not appended twice, and all of it there after a reopen."""
    if not backend.durable:
        pytest.skip("the memory store keeps nothing: its runner holds the items")
    store = await backend.job_store()
    await store.save(Job(id="j1", function="f", tenant="t", event=None, status="IN_PROGRESS"))
    await store.add_outputs("j1", 1, [0, 1, 2], 3)
    await store.add_outputs("j1", 1, [0, 1, 2], 3)  # sent again
    await store.add_outputs("j1", 4, list(range(3, 2003)), 2003)  # one long batch
    stored = await read_back(store, "j1")
    assert stored is not None and stored.outputs == list(range(2003))
    await store.save(Job(id="j2", function="f", tenant="t", event=None, status="COMPLETED", completed_at=1.0))
    await store.add_outputs("j2", 1, ["x"], 1)
    await store.clear_outputs("j2")
    assert (await read_back(store, "j2")).outputs == []
    await store.delete(["j2"])  # by the node that owns it (on a shared store no other node may)
    assert await read_back(store, "j2") is None
    await backend.close(store)
    reopened = await backend.job_store()
    stored = await read_back(reopened, "j1")
    assert stored is not None and stored.outputs == list(range(2003)) and stored.status == "IN_PROGRESS"
    assert await read_back(reopened, "j2") is None


async def test_a_function_deployed_at_run_time_is_deployed_again_by_the_next_node(backend, start_node):
    """What the admin API deploys (deployed, then remembered as frontend/jobs.py does) comes back
    after a restart on a durable configuration (SQLite keeps it in the store; in cluster mode the
    shared registry keeps it, and the Redis job store keeps none), and a deleted one does not."""
    node = await start_node()
    specs = [FunctionSpec.model_validate({"name": name, "handler": "job_fns.echo", "codePath": str(HANDLERS),
                                          "tenant": "acme"}) for name in ("kept", "deleted")]
    for dep in await node.registry.adeploy(specs):
        assert node.store is not None
        await node.store.save_function(dep.key, dep.spec.model_dump(mode="json"))
    gone = node.registry.delete("acme/deleted")
    if node.store is not None:
        await node.store.delete_function(gone.key)
    if node.cluster is not None:  # as the admin API's cluster middleware does (frontend/cluster.py)
        await node.cluster.sync.flush()

    async def deployed_here(on: Node) -> set[str]:
        return {d.name for d in on.registry.list() if d.spec.tenant == "acme"}

    assert await deployed_here(node) == {"acme-echo", "kept"}
    await stop(node)
    again = await start_node()
    want = {"acme-echo", "kept"} if backend.durable else {"acme-echo"}
    assert await eventually(lambda: deployed_here(again), "the functions to be deployed again",
                            accept=lambda names: names == want) == want
