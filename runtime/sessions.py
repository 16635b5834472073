"""Instance sessions (openYuanrong's `X-Instance-Session`): turns of one conversation on one instance.

A session is opened by the first invocation that names it and lives `ttl` seconds from its last
use. Its invocations run at most `concurrency` at once (more wait their turn, within their
deadline). For `executor: process` the pool pins the session to one worker (`Session.worker`);
when that worker dies the next turn runs on another and `restarted` tells the handler its
in-memory state is gone. In-process executors have a single instance: nothing to pin, but the
turn limit, interrupt and end work the same.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import (
    BadRequestError,
    ConcurrencyLimitError,
    FunctionNotFoundError,
    FunctionServiceError,
    HandlerError,
)
from .limits import Waiters

__all__ = (
    "DEFAULT_SESSION_TTL",
    "MAX_SESSIONS",
    "MAX_SESSION_ID",
    "MAX_SESSION_TTL",
    "Session",
    "SessionInterruptedError",
    "SessionRequest",
    "SessionTable",
    "Turn",
    "parse_session_header",
)

MAX_SESSION_ID = 63           # openYuanrong's limit
MAX_SESSION_TTL = 86_400.0    # a day: a session is a conversation, not a database
DEFAULT_SESSION_TTL = 600.0
MAX_SESSIONS = 10_000         # per function: the table is bounded like every other queue


class Turn(Protocol):
    """What a session needs of an invocation it runs (runtime/invocation.py Invocation): a way to stop
    it. A Protocol, so that this leaf imports nothing of the invocation (deployments hold sessions)."""

    def abort(self, error: FunctionServiceError) -> None: ...


class SessionInterruptedError(HandlerError):
    """The session's running invocation was interrupted (`POST .../sessions/{id}/interrupt`)."""


@dataclass(frozen=True)
class SessionRequest:
    """A parsed `X-Instance-Session` header. `concurrency` -1 = exclusive use of the instance."""

    id: str
    ttl: float
    concurrency: int


def parse_session_header(value: str) -> SessionRequest:
    """`{"sessionID": str, "sessionTTL": seconds, "concurrency": n}` -> SessionRequest, or 400."""
    def bad(why: str) -> BadRequestError:
        return BadRequestError(f"header X-Instance-Session: {why}")
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):  # nested past the parser's stack: malformed like any other
        raise bad('not JSON; expected {"sessionID": "...", "sessionTTL": seconds, "concurrency": n}') from None
    if not isinstance(doc, dict):
        raise bad("expected a JSON object")
    unknown = sorted(set(doc) - {"sessionID", "sessionTTL", "concurrency"})
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}")
    sid = doc.get("sessionID")
    if not isinstance(sid, str) or not sid:
        raise bad("'sessionID' must be a non-empty string")
    if len(sid) > MAX_SESSION_ID:
        raise bad(f"'sessionID' is {len(sid)} characters; at most {MAX_SESSION_ID}")
    if not sid.isprintable() or "/" in sid:
        raise bad("'sessionID' must be printable and contain no '/'")
    ttl = doc.get("sessionTTL", DEFAULT_SESSION_TTL)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) \
            or not 0 < ttl <= MAX_SESSION_TTL:
        raise bad(f"'sessionTTL' must be a number of seconds in (0, {MAX_SESSION_TTL:g}]")
    concurrency = doc.get("concurrency", 1)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) \
            or not (concurrency == -1 or 1 <= concurrency <= 10_000):
        raise bad("'concurrency' must be an integer from 1 to 10000, or -1 (exclusive use of the instance)")
    return SessionRequest(sid, float(ttl), concurrency)


class Session:
    """One live session: its turn limit, its running invocations and (process) its instance."""

    def __init__(self, request: SessionRequest) -> None:
        self.id = request.id
        self.ttl = request.ttl
        self.concurrency = request.concurrency
        self.exclusive = request.concurrency == -1
        self.created = time.time()
        self.last_used = time.monotonic()
        self.turns = 0
        self.running: set[Turn] = set()
        self._waiters = Waiters()
        self.worker: Any = None        # the WorkerProcess it is pinned to (executor: process)
        self.restarted = False         # its worker died: the next turn is told (context.session_restarted)
        self.placed = False            # a turn of it was given a worker once (executor: process)
        self.on_end: list[Callable[[Session], None]] = []

    def expired(self, now: float) -> bool:
        return not self.running and not self._waiters and now - self.last_used > self.ttl

    def expires_at(self) -> float:
        """Monotonic time after which the session ends if unused."""
        return self.last_used + self.ttl

    async def enter(self, inv: Turn) -> None:
        """Wait for a turn (at most `concurrency` running), then count `inv` as running."""
        limit = self.concurrency if self.concurrency > 0 else math.inf
        await self._waiters.wait_while(lambda: len(self.running) >= limit)
        self.running.add(inv)
        self.turns += 1
        self.last_used = time.monotonic()

    def leave(self, inv: Turn) -> None:
        self.running.discard(inv)
        self.last_used = time.monotonic()
        self._waiters.wake_one()

    def interrupt(self, reason: str) -> int:
        """Stop every running invocation of the session; how many there were."""
        running = list(self.running)
        for inv in running:
            inv.abort(SessionInterruptedError(reason))
        return len(running)

    def end(self) -> None:
        for callback in self.on_end:
            callback(self)
        self.on_end.clear()
        self.worker = None

    def describe(self) -> dict[str, Any]:
        pid = getattr(self.worker, "pid", None)
        idle = time.monotonic() - self.last_used
        return {"sessionID": self.id, "sessionTTL": self.ttl, "concurrency": self.concurrency,
                "running": len(self.running), "turns": self.turns, "pid": pid,
                "idleSeconds": round(idle, 3), "ageSeconds": round(max(0.0, time.time() - self.created), 3),
                "expiresInSeconds": None if self.running else round(max(0.0, self.ttl - idle), 3)}


class SessionTable:
    """The live sessions of one deployment, swept of expired ones whenever it is used."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self._sessions: dict[str, Session] = {}
        self._swept = 0.0
        # Totals for /metrics (frontend/metrics.py), kept across a redeploy (`adopt`).
        self.opened = 0
        self.expired = 0    # ended by their TTL
        self.deleted = 0    # ended by `DELETE .../sessions/{id}`
        self.refused = 0    # not opened: the table was full, or its exclusive share refused (429)

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, request: SessionRequest) -> Session:
        """The live session `request` names, or a new one (its TTL follows the latest request)."""
        self.sweep()
        session = self._sessions.get(request.id)
        if session is not None and session.expired(time.monotonic()):
            self._expire(request.id)
            session = None
        if session is None:
            if len(self._sessions) >= self.limit:
                self.refused += 1
                raise ConcurrencyLimitError(f"too many live sessions ({self.limit}); end some or retry later")
            session = self._sessions[request.id] = Session(request)
            self.opened += 1
        session.ttl = request.ttl
        session.last_used = time.monotonic()
        return session

    def get(self, session_id: str) -> Session:
        self.sweep()
        session = self._sessions.get(session_id)
        if session is not None and session.expired(time.monotonic()):
            self._expire(session_id)
            session = None
        if session is None:
            raise FunctionNotFoundError(f"session {session_id!r} not found", code=200404)
        return session

    def end(self, session_id: str) -> Session:
        session = self.get(session_id)
        del self._sessions[session_id]
        self.deleted += 1
        session.end()
        return session

    def drop_refused(self, session: Session) -> None:
        """`session` was refused its first worker (an exclusive share, 429): unless another turn of it
        is running or waiting, it never existed: no entry, no count toward the table's limit."""
        if session.placed or session.running or session._waiters or self._sessions.get(session.id) is not session:
            return
        del self._sessions[session.id]
        self.opened -= 1
        self.refused += 1
        session.end()

    def _expire(self, session_id: str) -> None:
        self._sessions.pop(session_id).end()
        self.expired += 1

    def sweep(self, force: bool = False) -> None:
        """End sessions unused for longer than their TTL (at most once a second unless forced)."""
        now = time.monotonic()
        if not force and now - self._swept < 1.0:
            return
        self._swept = now
        for sid in [sid for sid, s in self._sessions.items() if s.expired(now)]:
            self._expire(sid)

    def adopt(self, old: SessionTable) -> None:
        """A redeploy: the sessions go on, on the new code's instances, each told it restarted."""
        for sid, session in old._sessions.items():
            if sid not in self._sessions:
                had_worker = session.worker is not None
                session.end()
                session.restarted = session.restarted or had_worker
                self._sessions[sid] = session
        old._sessions = {}
        self.opened, self.expired = self.opened + old.opened, self.expired + old.expired
        self.deleted, self.refused = self.deleted + old.deleted, self.refused + old.refused

    def describe(self) -> list[dict[str, Any]]:
        self.sweep()
        return [s.describe() for s in self._sessions.values()]
