"""A pipelined connection of its own to one Redis server, for the Batcher's commands.

redis-py's client spends ~50 µs of CPU on a pipeline (a Pipeline object, a pooled connection
checked out and in, a health check, a task awaiting each reply in turn) and half that on a plain
command — more than Redis spends running them, and a queued JSON call costs a frontend one and a
worker two. Here a loop turn's commands are packed by hiredis into one write on one asyncio
transport, and `data_received` parses the replies (hiredis) and hands each batch its list: no
task, no pool, and batches of several loop turns in flight on one connection at once, answered in
order. The replies are redis-py's: its error classes, its response callbacks (SET gives True,
XREVRANGE pairs). Used for a plain TCP `redis://` server; TLS, Unix sockets, credential providers
and Redis Cluster keep redis-py's path (batch.py). Like redis-py's client: connect within
`socket_connect_timeout`, AUTH and SELECT first, a reply not there within `socket_timeout` drops
the connection (every batch in flight fails with the TimeoutError), a connection lost fails what
was in flight with ConnectionError, and the next batch connects again.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from .packing import pack

__all__ = ("LeanConnection", "lean_for")

_MORE = object()   # hiredis: no whole reply buffered yet


class _Pending:
    __slots__ = ("commands", "future", "replies", "sent")

    def __init__(self, commands: list[tuple[EncodableT, ...]], future: asyncio.Future[list[Any]], sent: float) -> None:
        self.commands, self.future, self.sent = commands, future, sent
        self.replies: list[Any] = []


class LeanConnection(asyncio.Protocol):
    """One TCP connection; `send(commands)` writes them at once and returns their replies in order
    (a command's error as its reply, an exception; a lost connection raises)."""

    def __init__(self, client: Any) -> None:
        kwargs = client.connection_pool.connection_kwargs
        self.host, self.port = kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))
        self.connect_timeout = kwargs.get("socket_connect_timeout") or None
        self.timeout = kwargs.get("socket_timeout") or None
        handshake: list[tuple[EncodableT, ...]] = []
        password, username = kwargs.get("password"), kwargs.get("username")
        if password is not None:
            handshake.append(("AUTH", username, password) if username else ("AUTH", password))
        if int(kwargs.get("db") or 0):
            handshake.append(("SELECT", int(kwargs["db"])))
        self._handshake = handshake
        self._reader_args: dict[str, Any] = {"protocolError": InvalidResponse, "replyError": BaseParser.parse_error,
                                             "notEnoughData": _MORE}
        if kwargs.get("decode_responses"):
            self._reader_args.update(encoding=kwargs.get("encoding", "utf-8"),
                                     errors=kwargs.get("encoding_errors", "strict"))
        self._callbacks = client.response_callbacks
        self._transport: asyncio.Transport | None = None
        self._reader: Any = None
        self._pending: deque[_Pending] = deque()
        self._opening: asyncio.Future[None] | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._closed = False

    async def send(self, commands: list[tuple[EncodableT, ...]]) -> list[Any]:
        if self._transport is None or self._transport.is_closing():
            await self._open()
        return await self._write(commands)

    async def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    # -- the connection ----------------------------------------------------------------------
    async def _open(self) -> None:
        if self._closed:
            raise RedisConnectionError("the connection was closed")
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
            self._opening.add_done_callback(self._opened)
        await asyncio.shield(self._opening)

    def _opened(self, opening: asyncio.Future[None]) -> None:
        self._opening = None
        if not opening.cancelled():
            opening.exception()   # retrieved: each waiter got it

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self, self.host, self.port), self.connect_timeout)
        except TimeoutError:
            raise RedisTimeoutError(f"Timeout connecting to {self.host}:{self.port}") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error connecting to {self.host}:{self.port}: {exc}") from exc
        if self._handshake:
            try:
                replies = await self._write(self._handshake)
            except BaseException:
                self._drop()
                raise
            for reply in replies:
                if isinstance(reply, Exception):
                    self._drop()
                    raise reply

    def _drop(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _write(self, commands: list[tuple[EncodableT, ...]]) -> asyncio.Future[list[Any]]:
        transport = self._transport
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        if transport is None or transport.is_closing():
            future.set_exception(RedisConnectionError("Connection closed by server."))
            return future
        data = b"".join([pack(command) for command in commands])   # a DataError before anything is sent
        self._pending.append(_Pending(commands, future, loop.time()))
        transport.write(data)
        if self._watch is None and self.timeout:
            self._watch = loop.call_later(self.timeout, self._overdue)
        return future

    def _overdue(self) -> None:
        """socket_timeout: a reply not there in time drops the connection, as redis-py's client would."""
        self._watch = None
        if not self._pending:
            return
        loop = asyncio.get_running_loop()
        late = self._pending[0].sent + float(self.timeout or 0) - loop.time()
        if late > 0:
            self._watch = loop.call_later(late, self._overdue)
            return
        self._fail(RedisTimeoutError("Timeout reading from socket"))
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, exc: Exception) -> None:
        pending, self._pending = self._pending, deque()
        for p in pending:
            if not p.future.done():
                p.future.set_exception(exc)

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)   # (uvloop's is no subclass of it)
        self._reader = hiredis.Reader(**self._reader_args)

    def data_received(self, data: bytes) -> None:
        reader, pending, callbacks = self._reader, self._pending, self._callbacks
        reader.feed(data)
        while pending:
            head = pending[0]
            replies, commands = head.replies, head.commands
            while len(replies) < len(commands):
                reply = reader.gets()
                if reply is _MORE:
                    return
                if not isinstance(reply, Exception):
                    callback = callbacks.get(commands[len(replies)][0])
                    if callback is not None:
                        try:
                            reply = callback(reply)
                        except Exception as exc:   # (a reply its callback cannot read: that caller's error)
                            reply = exc
                replies.append(reply)
            pending.popleft()
            if not head.future.done():
                head.future.set_result(replies)
        if reader.gets() is not _MORE:   # a reply nobody asked for: the stream is out of step
            self._fail(InvalidResponse("a reply with no command"))
            self._drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._fail(RedisConnectionError("Connection closed by server."))


def lean_for(client: Any) -> LeanConnection | None:
    """A LeanConnection for a client of one Redis server over plain TCP, else None (redis-py's path)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None   # a RedisCluster
    kwargs = pool.connection_kwargs
    cls = pool.connection_class
    if (not issubclass(cls, Connection) or issubclass(cls, SSLConnection) or kwargs.get("credential_provider")
            or kwargs.get("client_name") or kwargs.get("protocol") not in (None, 2, "2")):
        return None
    return LeanConnection(client)
