"""The real server over real sockets: `fnstream serve` as a subprocess, and the CLI."""
import asyncio
import json
import subprocess
import sys
import time

import aiohttp
import yaml

from tests.support.servers import FUNCTIONS, HANDLERS, HELLO_BYTES, ROOT, assert_live, read_events

SSE = {"Accept": "text/event-stream"}


async def raw_http(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


async def test_hello_over_real_socket(server):
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/serverless/v1/functions/hello/invocations", headers=SSE) as r:
            assert r.status == 200
            assert await r.read() == HELLO_BYTES
    # and on the wire: chunked, no compression even when the client offers it
    raw = await raw_http(server.port, b"POST /serverless/v1/functions/hello/invocations HTTP/1.1\r\n"
                         b"Host: localhost\r\nAccept: text/event-stream\r\nAccept-Encoding: gzip\r\n"
                         b"Connection: close\r\nContent-Length: 0\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-encoding" not in head.lower()
    assert b'data: {"event": "this is a stream"}' in body and b"data: [DONE]" in body


async def test_ticker_arrival_over_real_socket(server):
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/serverless/v1/functions/ticker/invocations", headers=SSE,
                          json={"count": 5, "delay_ms": 200}) as r:
            events = await read_events(r)
    assert [json.loads(e["data"]) for _, e in events[:5]] == [{"tick": i, "of": 5} for i in range(1, 6)]
    assert events[-1][1]["data"] == "[DONE]"
    assert_live([t for t, _ in events[:5]], 0.8)


async def test_disconnect_over_real_socket_frees_the_slot(server):
    async with aiohttp.ClientSession() as s:
        r = await s.post(server.url + "/serverless/v1/functions/ticker/invocations", headers=SSE,
                         json={"count": 100000, "delay_ms": 10})
        assert len(await read_events(r, limit=3)) == 3
        r.close()
        deadline = time.monotonic() + 1.0
        inflight = None
        while time.monotonic() < deadline:
            async with s.get(server.url + "/admin/v1/functions/ticker") as info:
                inflight = (await info.json())["function"]["status"]["inflight"]
            if inflight == 0:
                break
            await asyncio.sleep(0.05)
        assert inflight == 0


async def test_heartbeat_is_a_comment_without_blank_line(start_server, tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "f.yaml").write_text(yaml.safe_dump(
        {"name": "slow", "handler": "testfns.sync_ticker", "codePath": str(HANDLERS)}))
    server = start_server("--deploy-dir", str(deploy), "-s", f"runtime.codeRoots=[{HANDLERS}]",
                          "-s", "frontend.args.heartbeatSeconds=0.1")
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/serverless/v1/functions/slow/invocations", headers=SSE,
                          json={"count": 2, "delay_ms": 500}) as r:
            body = await r.read()
    assert b": ping\n" in body
    assert b": ping\n\n" not in body
    assert body.endswith(b'id: 3\ndata: "done"\n\ndata: [DONE]\n\n')


def test_serve_refuses_bad_manifests(tmp_path):
    (tmp_path / "one.yaml").write_text(yaml.safe_dump({"name": "one", "handler": "no-such module"}))
    (tmp_path / "two.yaml").write_text(yaml.safe_dump({"name": "two", "handler": "echo.handler", "timeout": "x"}))
    proc = subprocess.run([sys.executable, "-m", "frontend.cli", "serve", "--deploy-dir", str(tmp_path), "--port", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "one.yaml" in proc.stderr and "two.yaml" in proc.stderr and "field 'timeout'" in proc.stderr


def test_serve_refuses_bad_config():
    proc = subprocess.run([sys.executable, "-m", "frontend.cli", "serve", "-s", "frontend.args.enableEvnt=true"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown key 'frontend.args.enableEvnt'" in proc.stderr


def cli(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frontend.cli", *args, "--url", server.url],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_cli_deploy_functions_invoke_delete(server, tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({"name": "cli-echo", "handler": "echo.handler", "codePath": str(FUNCTIONS)}))
    proc = cli(server, "deploy", str(manifest))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["cli-echo", proc.stdout.split()[1]]  # a line: name, URN, executor, ...
    assert proc.stdout.split()[1].endswith("@cli-echo:latest")
    assert cli(server, "deploy", str(manifest)).returncode == 0  # redeploy goes through PUT
    proc = cli(server, "functions")
    assert "cli-echo" in proc.stdout and "ticker" in proc.stdout
    proc = cli(server, "invoke", "cli-echo", "--data", '{"k": 1}')
    assert json.loads(proc.stdout) == {"k": 1}
    proc = cli(server, "invoke", "ticker", "--data", '{"count": 3, "delay_ms": 10}', "--stream")
    assert proc.stdout.splitlines() == ['{"tick":1,"of":3}', '{"tick":2,"of":3}', '{"tick":3,"of":3}',
                                        '{"ticks":3}', "[DONE]"]
    assert cli(server, "delete", "cli-echo").returncode == 0
    proc = cli(server, "invoke", "cli-echo")
    assert proc.returncode == 1 and "150424" in proc.stdout


async def test_cli_stream_prints_as_events_arrive(server):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "frontend.cli", "invoke", "ticker", "--stream", "--url", server.url,
        "--data", json.dumps({"count": 4, "delay_ms": 300}), cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    start = time.monotonic()
    arrivals = []
    async for _line in proc.stdout:
        arrivals.append(time.monotonic() - start)
    await proc.wait()
    assert len(arrivals) == 6
    # printed one by one as they arrive (3 gaps of 300 ms), not in one burst at the end
    assert arrivals[3] - arrivals[0] > 0.6, arrivals


async def test_sigterm_lets_short_work_finish_and_ends_long_streams_cleanly(start_server):
    import signal
    server = start_server("-s", "frontend.args.shutdownGraceSeconds=1")
    async with aiohttp.ClientSession() as s:
        long_resp = await s.post(server.url + "/serverless/v1/functions/ticker/invocations", headers=SSE,
                                 json={"count": 1000, "delay_ms": 100})
        short_resp = await s.post(server.url + "/serverless/v1/functions/ticker/invocations", headers=SSE,
                                  json={"count": 4, "delay_ms": 100})
        plain = asyncio.ensure_future(s.post(server.url + "/serverless/v1/functions/ticker/invocations",
                                             json={"count": 1000, "delay_ms": 100}))
        assert len(await read_events(long_resp, limit=1)) == 1
        await asyncio.sleep(0.2)
        server.proc.send_signal(signal.SIGTERM)
        short_events = [e["data"] for _, e in await read_events(short_resp)]
        long_events = [e["data"] for _, e in await read_events(long_resp)]
        plain_resp = await plain
        plain_body = await plain_resp.json()
    assert short_events[-2:] == ['{"ticks":4}', "[DONE]"]  # finished within the grace period
    error = json.loads(long_events[-2])
    assert error["code"] == 200503 and "shutting down" in error["message"]
    assert long_events[-1] == "[DONE]"
    assert plain_resp.status == 503 and plain_body["code"] == 200503
    assert server.proc.wait(10) == 0
