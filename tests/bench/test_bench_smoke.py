"""The benchmark still works: its client drives a real `fnstream serve` with the bench functions.

No timing is asserted (figures come from `python -m bench.run`); only that every stream and
every invoke came back whole.
"""
from __future__ import annotations

import asyncio

from bench.client import Target, burst_streams, hold_streams, run_invokes, run_streams
from bench.servers import BENCH, TARGETS


def _target(server, name: str) -> Target:
    _kind, stream_path, echo_path = TARGETS[name]
    return Target(name, "127.0.0.1", server.port, stream_path, echo_path)


def test_bench_client_against_fnstream(start_server):
    # Access logs off: thousands of requests would fill the fixture's unread stdout pipe.
    server = start_server("--config", str(BENCH / "config.yaml"), env={"FNSTREAM_LOG": "WARNING"})

    async def drive():
        for name in ("fnstream-async", "fnstream-thread", "fnstream-process"):
            target = _target(server, name)
            results = await run_streams(target, {"count": 50}, 5)
            assert [(r.status, r.events) for r in results] == [(200, 51)] * 5  # 50 events + [DONE]
            assert all(r.first_event is not None and r.ended >= r.first_event for r in results)
            burst = await burst_streams(target, {"count": 5}, 20)
            assert [(r.status, r.events) for r in burst] == [(200, 6)] * 20
            invokes = await run_invokes(target, {"x": [1, 2]}, 4, 0.4)
            assert invokes.requests > 0 and invokes.errors == 0
        held = await hold_streams(_target(server, "fnstream-async"), {"count": 1, "hold_s": 30}, 3)
        for transport in held:
            transport.close()

    asyncio.run(asyncio.wait_for(drive(), 60))
