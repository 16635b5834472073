"""The session table's contract (runtime/sessions.py SessionTable, its one implementation): the
invariants the invoke path, the pool and the session routes rely on, on a clock the test moves.

Open, get, list and end; TTL from the last use, never while a turn runs or waits, swept at most
once a second unless forced; a full table refuses (429) rather than evicting; each end is
announced once; turns at most `concurrency` at once, a waiting turn admitted when one leaves; one
table per deployment, so per tenant; a redeploy carries the sessions over, each told it
restarted. Over HTTP and on process workers: tests/frontend/test_session_routes.py,
tests/runtime/process/test_instances.py.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from runtime import sessions
from runtime.errors import ConcurrencyLimitError, FunctionNotFoundError
from runtime.manifest import FunctionSpec
from runtime.registry import Registry
from runtime.sessions import SessionRequest, SessionTable
from tests.support.servers import HANDLERS
from tests.support.waiting import eventually


class Clock:
    """runtime.sessions' `time`, moved by the test: monotonic and wall time in step."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(sessions, "time", fake)
    return fake


class FakeTurn:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, error) -> None:
        self.aborted.append(error.message)


def request(sid: str = "s1", ttl: float = 10.0, concurrency: int = 1) -> SessionRequest:
    return SessionRequest(sid, ttl, concurrency)


def test_open_get_list_and_end(clock):
    table = SessionTable()
    session = table.open(request("s1"))
    assert table.open(request("s1")) is session and len(table) == 1  # the live one, not a second
    assert table.get("s1") is session
    table.open(request("s2"))
    assert [d["sessionID"] for d in table.describe()] == ["s1", "s2"]  # in the order opened
    ended = []
    session.on_end.append(ended.append)
    assert table.end("s1") is session
    assert ended == [session]
    with pytest.raises(FunctionNotFoundError) as caught:
        table.get("s1")
    assert caught.value.code == 200404
    with pytest.raises(FunctionNotFoundError):
        table.end("s1")  # ended once
    assert (table.opened, table.deleted, table.expired, len(table)) == (2, 1, 0, 1)


def test_a_session_lives_its_ttl_from_its_last_use(clock):
    table = SessionTable()
    session = table.open(request("s1", ttl=10))
    clock.advance(8)
    assert table.open(request("s1", ttl=10)) is session  # used again: 10 s from now
    clock.advance(8)
    assert table.get("s1") is session
    assert session.describe()["expiresInSeconds"] == 2.0
    clock.advance(2.5)
    with pytest.raises(FunctionNotFoundError):
        table.get("s1")
    assert table.expired == 1
    assert table.open(request("s1")) is not session  # a new session under the old id


def test_the_latest_request_sets_the_ttl(clock):
    table = SessionTable()
    session = table.open(request("s1", ttl=100))
    table.open(request("s1", ttl=5))
    clock.advance(6)
    with pytest.raises(FunctionNotFoundError):
        table.get("s1")
    assert session.ttl == 5


def test_a_session_never_expires_while_a_turn_runs_or_waits(clock):
    async def scenario():
        table = SessionTable()
        session = table.open(request("s1", ttl=1))
        first, second = FakeTurn(), FakeTurn()
        await session.enter(first)
        waiting = asyncio.create_task(session.enter(second))
        await eventually(lambda: bool(session._waiters), "the second turn to wait")
        clock.advance(100)
        table.sweep(force=True)
        assert table.get("s1") is session  # running and waiting: alive however long it takes
        session.leave(first)
        await waiting
        session.leave(second)
        clock.advance(100)
        table.sweep(force=True)
        assert len(table) == 0 and table.expired == 1

    asyncio.run(scenario())


def test_the_sweep_runs_at_most_once_a_second_unless_forced(clock):
    table = SessionTable()
    table.open(request("a", ttl=1))
    table.sweep()                       # at 1000: sweeps (nothing to end)
    clock.advance(0.5)
    table.open(request("b", ttl=0.1))   # opened at 1000.5
    clock.advance(0.3)                  # b expired; the last sweep was 0.8 s ago
    table.sweep()
    assert len(table) == 2              # not swept yet: an expired session is still gone to `get`
    with pytest.raises(FunctionNotFoundError):
        table.get("b")
    table.open(request("c", ttl=0.1))
    clock.advance(0.3)
    table.sweep(force=True)
    assert [d["sessionID"] for d in table.describe()] == []  # a at 1.1 s idle, c at 0.3 s: both over


def test_a_full_table_refuses_and_evicts_nobody(clock):
    table = SessionTable(limit=2)
    a, b = table.open(request("a")), table.open(request("b"))
    with pytest.raises(ConcurrencyLimitError):
        table.open(request("c"))
    assert table.refused == 1 and table.get("a") is a and table.get("b") is b
    assert table.open(request("a")) is a  # a live one is still opened
    table.end("a")
    assert table.open(request("c")).id == "c"


def test_each_end_is_announced_once(clock):
    table = SessionTable()
    ends = []
    for sid, ttl in (("deleted", 10), ("expired", 1)):
        table.open(request(sid, ttl=ttl)).on_end.append(lambda s: ends.append(s.id))
    table.end("deleted")
    clock.advance(2)
    table.sweep(force=True)
    table.sweep(force=True)
    assert ends == ["deleted", "expired"]


def test_turns_run_at_most_concurrency_at_once_and_waiters_go_in(clock):
    async def scenario():
        session = SessionTable().open(request("s1", concurrency=2))
        turns = [FakeTurn() for _ in range(4)]
        for turn in turns[:2]:
            await session.enter(turn)
        entering = [asyncio.create_task(session.enter(turn)) for turn in turns[2:]]
        await eventually(lambda: len(session._waiters._queue) == 2, "two turns to wait")
        assert len(session.running) == 2
        session.leave(turns[0])
        await eventually(lambda: sum(t.done() for t in entering) == 1, "one waiting turn to go in")
        assert len(session.running) == 2 and turns[2] in session.running  # the first to wait
        session.leave(turns[1])
        await asyncio.gather(*entering)
        assert session.running == {turns[2], turns[3]} and session.turns == 4

    asyncio.run(scenario())


def test_a_cancelled_waiter_passes_its_turn_on(clock):
    async def scenario():
        session = SessionTable().open(request("s1", concurrency=1))
        running, leaving, next_turn = FakeTurn(), FakeTurn(), FakeTurn()
        await session.enter(running)
        gone = asyncio.create_task(session.enter(leaving))
        waiting = asyncio.create_task(session.enter(next_turn))
        await eventually(lambda: len(session._waiters._queue) == 2, "two turns to wait")
        session.leave(running)   # wakes `gone`...
        gone.cancel()            # ...which leaves before it takes the turn
        await waiting            # the turn is not lost
        assert session.running == {next_turn}

    asyncio.run(scenario())


def test_interrupt_stops_every_running_turn(clock):
    async def scenario():
        session = SessionTable().open(request("s1", concurrency=3))
        turns = [FakeTurn() for _ in range(2)]
        for turn in turns:
            await session.enter(turn)
        assert session.interrupt("stop it") == 2
        assert [t.aborted for t in turns] == [["stop it"], ["stop it"]]

    asyncio.run(scenario())


def test_sessions_are_per_deployment_so_per_tenant():
    registry = Registry([HANDLERS])
    specs = [FunctionSpec.model_validate({"name": "chat", "handler": "testfns.echo_sync", "codePath": str(HANDLERS),
                                          "tenant": tenant}) for tenant in ("acme", "other")]
    registry.deploy(specs)
    acme, other = registry.get("chat", "acme"), registry.get("chat", "other")
    mine = acme.sessions.open(request("shared-id"))
    with pytest.raises(FunctionNotFoundError):
        other.sessions.get("shared-id")  # the same id in another tenant names nothing
    assert other.sessions.open(request("shared-id")) is not mine
    assert [d["sessionID"] for d in other.sessions.describe()] == ["shared-id"]


def test_a_redeploy_carries_sessions_over_each_told_it_restarted(clock):
    old, new = SessionTable(), SessionTable()
    pinned = old.open(request("pinned"))
    pinned.worker = SimpleNamespace(pid=1)  # on a process worker: its in-memory state goes
    plain = old.open(request("plain"))
    old.end(old.open(request("gone")).id)
    ended = []
    pinned.on_end.append(ended.append)
    new.adopt(old)
    assert new.get("pinned") is pinned and new.get("plain") is plain and len(old) == 0
    assert pinned.restarted and pinned.worker is None and ended == [pinned]  # unpinned from the old pool
    assert not plain.restarted  # an in-process instance: nothing was lost
    assert (new.opened, new.deleted) == (3, 1)  # the totals go on
