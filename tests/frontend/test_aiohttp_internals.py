"""The private aiohttp attributes the listener (frontend/server.py) and body reader (frontend/body.py)
lean on. aiohttp is pinned to the tested minor in pyproject.toml; when a new minor is allowed, this
test names what moved instead of the listener misbehaving quietly."""
from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.web_protocol import RequestHandler

from frontend.server import FnstreamRunner

# Set and read on a connection's protocol: request counting, the pipelined-request queue, the
# flow-control flags the body deadline waits on, lingering close.
HANDLER_ATTRIBUTES = ("_request_count", "_messages", "_waiter", "_lingering_time", "_loop", "_paused",
                      "_reading_paused", "_buffer_paused")


def _slots(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
    return names


def test_the_request_handler_still_has_the_attributes_the_listener_uses() -> None:
    assert issubclass(RequestHandler, BaseProtocol)
    missing = [name for name in HANDLER_ATTRIBUTES if name not in _slots(RequestHandler)]
    assert not missing, f"aiohttp's RequestHandler no longer has {missing}: frontend/server.py needs a look"


async def test_the_server_and_runner_still_have_the_hooks_the_listener_uses() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    server = web.Server(ok, loop=asyncio.get_running_loop())
    for name in ("_connections", "_kwargs", "_loop", "request_handler", "request_factory"):
        assert hasattr(server, name), f"aiohttp's web.Server no longer has {name}: frontend/server.py needs a look"
    await server.shutdown()
    assert callable(getattr(web.AppRunner, "_make_server", None)), "AppRunner._make_server is gone"
    assert issubclass(FnstreamRunner, web.AppRunner)


async def test_a_started_site_still_shows_its_listening_sockets() -> None:
    # start_site hands them to runtime/fork_guard.py: a handler's fork must not keep them.
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        sockets = getattr(getattr(site, "_server", None), "sockets", None)
        assert sockets and all(s.fileno() >= 0 for s in sockets), "TCPSite._server.sockets is gone"
    finally:
        await runner.cleanup()


def test_the_runner_still_waits_for_open_responses_with_its_shutdown_timeout() -> None:
    """FnstreamRunner.shutdown sets `_shutdown_timeout` (what is left of the grace) for the wait
    that follows it in BaseRunner.cleanup."""
    import inspect

    source = inspect.getsource(web.BaseRunner.cleanup)
    assert "await self.shutdown()" in source and "self._server.shutdown(self._shutdown_timeout)" in source
    assert source.index("await self.shutdown()") < source.index("self._server.shutdown(self._shutdown_timeout)")
