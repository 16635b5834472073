"""Named streams across the process boundary: the same API in a worker as in the frontend.

In the worker, `ProxyBroker` is bound as the stream broker, so `create_stream_producer` & co.
(runtime/streams/api.py) work unchanged; each broker call becomes a `stream_call` frame. In the
frontend, `StreamBridge` runs those calls on the real broker and remembers the worker's
subscriptions and producers, so a worker that dies leaves nothing behind.
"""
from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .. import errors as core_errors
from ..errors import FunctionServiceError, HandlerError
from ..streams import errors as stream_errors
from ..streams.broker import AbstractBroker, AbstractSubscription, BrokerSettings, Element, StreamOptions, StreamStats
from ..streams.tenancy import qualify, tenant_of, unqualify
from .protocol import StreamCall, StreamReply

__all__ = ("ProxyBroker", "ProxySubscription", "StreamBridge", "stream_error")

log = logging.getLogger("fnstream.process")

Call = Callable[..., Any]  # the worker's blocking `stream_call(op, *args)` (any thread but its reader)
ACall = Callable[..., Awaitable[Any]]  # the same call awaited on the worker's event loop
Send = Callable[[StreamReply], bool]  # sends a reply frame to the worker; False if it is gone


def stream_error(name: str, message: str) -> BaseException:
    """Rebuild an error raised by the frontend's broker (stream errors, ValueError...)."""
    for module in (stream_errors, core_errors):
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, FunctionServiceError):
            return cls(message)
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(message)
    return HandlerError(message)


# -- worker side -------------------------------------------------------------------------------
class ProxySubscription(AbstractSubscription):
    def __init__(self, call: ACall, post: Callable[..., None], sub_id: int, name: str,
                 lost: Sequence[int] | None) -> None:
        self._call = call
        self._post = post
        self._id = sub_id
        self.name = name
        self.lost = tuple(lost) if lost else None  # type: ignore[assignment]
        self.last_id = 0

    async def next_batch(self, max_items: int | None = None, timeout: float | None = None) -> list[Element]:
        items = await self._call("sub_next", self._id, max_items, timeout)
        batch = [Element(data, ele_id) for ele_id, data in items]
        if batch:
            self.last_id = batch[-1].id
        return batch

    def ack(self, ele_id: int) -> None:
        self._post("sub_ack", self._id, ele_id)  # nothing to wait for: never block the loop on it

    async def close(self) -> None:
        await self._call("sub_close", self._id)


class ProxyBroker(AbstractBroker):
    """A broker whose every operation runs in the frontend (over the worker's connection)."""

    scoped_remotely = True  # the frontend's StreamBridge qualifies names with this worker's tenant

    def __init__(self, call: Call, acall: ACall, post: Callable[..., None]) -> None:
        self._call = call
        self._acall = acall
        self._post = post
        self._settings: BrokerSettings | None = None

    @property
    def settings(self) -> BrokerSettings:  # type: ignore[override]
        if self._settings is None:
            self._settings = BrokerSettings(max_element_size=self._call("max_element_size"))
        return self._settings

    async def _remote(self, op: str, *args: Any) -> Any:
        return await self._acall(op, *args)

    async def publish(self, name: str, elements: Sequence[bytes], *, timeout: float | None = None) -> list[int]:
        ids: list[int] = await self._remote("publish", name, [bytes(e) for e in elements], timeout)
        return ids

    async def subscribe(self, name: str, *, from_id: int | None = None,
                        buffer: int | None = None) -> AbstractSubscription:
        sub_id, real_name, lost = await self._remote("subscribe", name, from_id, buffer)
        return ProxySubscription(self._acall, self._post, sub_id, real_name, lost)

    async def configure(self, name: str, options: StreamOptions) -> None:
        await self._remote("configure", name, dataclasses.asdict(options))

    async def attach_producer(self, name: str, options: StreamOptions | None = None) -> None:
        await self._remote("attach_producer", name, None if options is None else dataclasses.asdict(options))

    async def detach_producer(self, name: str) -> None:
        await self._remote("detach_producer", name)

    async def stats(self, name: str) -> StreamStats:
        return StreamStats(**await self._remote("stats", name))

    async def list(self) -> list[StreamStats]:
        return [StreamStats(**s) for s in await self._remote("list")]

    async def delete(self, name: str) -> None:
        await self._remote("delete", name)


# -- frontend side -----------------------------------------------------------------------------
_NAMED_OPS = ("publish", "subscribe", "configure", "attach_producer", "detach_producer", "stats", "delete")


def _unqualified(tenant: str, stats: dict[str, Any]) -> dict[str, Any]:
    return {**stats, "name": unqualify(tenant, stats["name"]) or stats["name"]}


class StreamBridge:
    """Runs one worker's stream calls on the frontend's broker; `release` undoes what it left."""

    def __init__(self, send: Send, tenant: str) -> None:
        self._send = send
        self._tenant = tenant  # the worker's function's: every stream name it uses is this tenant's
        self._subs: dict[int, AbstractSubscription] = {}
        self._next_sub = 0
        self._producers: list[str] = []
        self._target: tuple[AbstractBroker, asyncio.AbstractEventLoop] | None = None

    def handle(self, msg: StreamCall) -> None:
        """Called on the worker's reader thread: run the call on the broker's loop, reply from there."""
        from ..streams import current_broker
        try:
            self._target = broker, loop = current_broker()
        except RuntimeError as exc:
            self._send({"t": "stream_reply", "seq": msg["seq"], "error": "RuntimeError", "message": str(exc)})
            return
        asyncio.run_coroutine_threadsafe(self._answer(broker, msg), loop)

    async def _answer(self, broker: AbstractBroker, msg: StreamCall) -> None:
        reply: StreamReply = {"t": "stream_reply", "seq": msg["seq"]}
        try:
            reply["value"] = await self._run(broker, msg["op"], *msg["args"])
        except Exception as exc:
            reply["error"], reply["message"] = type(exc).__name__, str(getattr(exc, "message", exc))
        # A batch of elements can be large: never block the loop on the worker's socket.
        await asyncio.to_thread(self._send, reply)

    async def _run(self, broker: AbstractBroker, op: str, *args: Any) -> Any:
        if op == "max_element_size":
            return broker.settings.max_element_size
        # Streams belong to the worker's tenant: the name is qualified here, never by the worker.
        tenant = self._tenant
        if op in _NAMED_OPS:
            args = (qualify(tenant, args[0]), *args[1:])
        if op == "list":
            return [_unqualified(tenant, s.to_dict()) for s in await broker.list() if tenant_of(s.name) == tenant]
        if op == "stats":
            return _unqualified(tenant, (await broker.stats(args[0])).to_dict())
        if op == "publish":
            return await broker.publish(args[0], args[1], timeout=args[2])
        if op == "subscribe":
            sub = await broker.subscribe(args[0], from_id=args[1], buffer=args[2])
            self._next_sub += 1
            self._subs[self._next_sub] = sub
            return [self._next_sub, unqualify(tenant, sub.name) or sub.name, list(sub.lost) if sub.lost else None]
        if op == "sub_next":
            batch = await self._subs[args[0]].next_batch(args[1], args[2])
            return [[e.id, e.data] for e in batch]
        if op == "sub_ack":
            return self._subs[args[0]].ack(args[1])
        if op == "sub_close":
            closing = self._subs.pop(args[0], None)
            return None if closing is None else await closing.close()
        if op in ("configure", "attach_producer"):
            options = None if args[1] is None else StreamOptions(**args[1])
            if op == "configure":
                return await broker.configure(args[0], options)  # type: ignore[arg-type]
            await broker.attach_producer(args[0], options)
            self._producers.append(args[0])
            return None
        if op == "detach_producer":
            if args[0] in self._producers:
                self._producers.remove(args[0])
            return await broker.detach_producer(args[0])
        if op == "delete":
            return await broker.delete(args[0])
        raise ValueError(f"unknown stream operation {op!r}")

    def release(self) -> None:
        """The worker is gone: close its subscriptions and detach its producers."""
        if self._target is None or not (self._subs or self._producers):
            return
        broker, loop = self._target
        subs, producers = list(self._subs.values()), list(self._producers)
        self._subs.clear()
        self._producers.clear()

        async def cleanup() -> None:
            for sub in subs:
                await sub.close()
            for name in producers:
                await broker.detach_producer(name)
        if not loop.is_closed():
            asyncio.run_coroutine_threadsafe(cleanup(), loop)
