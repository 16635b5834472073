"""preStop of thread and async functions on a real server: delete, redeploy and SIGTERM.

Each hook appends a line to a marker file named in the manifest's `environment`, so "exactly
once" and "after the invocations in flight" are read from that file, never from a clock.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from tests.support.servers import PROCESS_FUNCTIONS

PROC = PROCESS_FUNCTIONS


def start(start_server, tmp_path):
    empty = tmp_path / "deploy"
    empty.mkdir()
    return start_server("--deploy-dir", str(empty), "-s", f"runtime.codeRoots=[{PROC}]")


def manifest(name: str, marker: Path, handler: str = "stop_hooks.handler", pre_stop: str = "stop_hooks.pre_stop",
             tag: str = "v1", **fields) -> str:
    return json.dumps({"name": name, "handler": handler, "preStop": pre_stop, "codePath": ".",
                       "environment": {"marker": str(marker), "tag": tag}, **fields})


async def admin(session, server, method: str, name: str = "", body: str | None = None) -> dict:
    url = server.url + "/admin/v1/functions" + (f"/{name}" if name else "")
    async with session.request(method, url, data=body) as resp:
        data = await resp.json()
        assert resp.status in (200, 201), data
        return data


async def call(session, server, name: str, event: dict) -> dict:
    async with session.post(f"{server.url}/serverless/v1/functions/{name}/invocations", json=event) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        return data


def lines(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []


async def wait_for_lines(marker: Path, count: int) -> list[str]:
    for _ in range(400):  # a bounded wait for the hook, not a timing check
        if len(lines(marker)) >= count:
            return lines(marker)
        await asyncio.sleep(0.025)
    raise AssertionError(f"{marker} has {lines(marker)}, expected {count} line(s)")


async def test_delete_runs_pre_stop_once_for_thread_and_async(start_server, tmp_path):
    server = start(start_server, tmp_path)
    sync_marker, async_marker = tmp_path / "sync", tmp_path / "async"
    async with aiohttp.ClientSession() as session:
        await admin(session, server, "POST", body=manifest("t-stop", sync_marker))
        await admin(session, server, "POST", body=manifest("a-stop", async_marker, handler="stop_hooks.ahandler",
                                                           pre_stop="stop_hooks.apre_stop"))
        await call(session, server, "t-stop", {})
        await call(session, server, "a-stop", {})
        for name in ("t-stop", "a-stop"):
            body = await admin(session, server, "GET", name)
            assert body["function"]["status"]["executor"] == ("thread" if name == "t-stop" else "async")
            await admin(session, server, "DELETE", name)
        assert await wait_for_lines(sync_marker, 1) == ["preStop v1"]
        assert await wait_for_lines(async_marker, 1) == ["apreStop v1"]
    output = server.stop()  # shutdown must not run the hooks of deleted functions again
    assert server.proc.returncode == 0, output
    assert lines(sync_marker) == ["preStop v1"] and lines(async_marker) == ["apreStop v1"]


async def test_redeploy_runs_the_old_pre_stop_after_its_invocations(start_server, tmp_path):
    server = start(start_server, tmp_path)
    marker = tmp_path / "marker"
    async with aiohttp.ClientSession() as session:
        await admin(session, server, "POST", body=manifest("t-re", marker))
        inflight = asyncio.ensure_future(call(session, server, "t-re", {"seconds": 1}))
        for _ in range(200):  # until the old revision's invocation is really running
            if (await admin(session, server, "GET", "t-re"))["function"]["status"]["inflight"] == 1:
                break
            await asyncio.sleep(0.02)
        await admin(session, server, "PUT", "t-re", manifest("t-re", marker, tag="v2"))
        assert (await call(session, server, "t-re", {}))["tag"] == "v2"
        assert (await inflight)["tag"] == "v1"  # finished on the old code
        assert await wait_for_lines(marker, 2) == ["invocation-end v1", "preStop v1"]
    output = server.stop()  # the new revision's preStop runs at shutdown; the old one's not again
    assert server.proc.returncode == 0, output
    assert lines(marker) == ["invocation-end v1", "preStop v1", "preStop v2"]


async def test_sigterm_runs_each_pre_stop_once_even_when_one_fails_or_hangs(start_server, tmp_path):
    server = start(start_server, tmp_path)
    sync_marker, async_marker, slow_marker = tmp_path / "sync", tmp_path / "async", tmp_path / "slow"
    async with aiohttp.ClientSession() as session:
        await admin(session, server, "POST", body=manifest("t-term", sync_marker))
        await admin(session, server, "POST", body=manifest("a-term", async_marker, handler="stop_hooks.ahandler",
                                                           pre_stop="stop_hooks.apre_stop"))
        await admin(session, server, "POST", body=manifest("t-broken", tmp_path / "unused",
                                                           pre_stop="stop_hooks.broken_pre_stop"))
        # timeout 1: its preStop gets min(1, 180) s, then the shutdown goes on without it
        await admin(session, server, "POST", body=manifest("t-slow", slow_marker, pre_stop="stop_hooks.slow_pre_stop",
                                                           timeout=1))
        await call(session, server, "t-term", {})
    output = server.stop()
    assert server.proc.returncode == 0, output
    assert lines(sync_marker) == ["preStop v1"] and lines(async_marker) == ["apreStop v1"]
    assert lines(slow_marker) == ["slow-preStop-started v1"]
    assert "function t-broken: preStop failed: RuntimeError: preStop blew up" in output
    assert "function t-slow: preStop did not finish within 1 s" in output
