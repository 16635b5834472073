"""frontend.limits over real sockets against a real `fnstream serve`: slowloris clients are cut,
idle keep-alive connections closed, too large headers answered 431 JSON, connections past the cap
answered 503 JSON — and an SSE response longer than every timeout runs to its end."""
from __future__ import annotations

import json
import select
import socket
import time

import pytest

from tests.support.servers import read_events

LIMITS = ["-s", "frontend.limits.keepAliveSeconds=1", "-s", "frontend.limits.headerTimeoutSeconds=1",
          "-s", "frontend.limits.bodyTimeoutSeconds=1"]


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _read_until_closed(sock: socket.socket, limit: float = 10) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and how long that took."""
    start, data = time.monotonic(), b""
    sock.settimeout(limit)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - start


def _split(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _get(path: str = "/healthz", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n".encode()


def test_client_sending_nothing_is_closed_after_the_header_timeout(start_server):
    server = start_server(*LIMITS, "-s", "frontend.limits.keepAliveSeconds=30")
    with _connect(server) as sock:
        data, took = _read_until_closed(sock)
    assert data == b"" and 0.8 < took < 5


def test_slowloris_headers_one_byte_a_time_are_cut_with_408(start_server):
    server = start_server(*LIMITS, "-s", "frontend.limits.keepAliveSeconds=30")
    request = _get()
    with _connect(server) as sock:
        start = time.monotonic()
        try:
            for byte in request[:-2]:  # never the final CRLF
                sock.send(bytes([byte]))
                time.sleep(0.2)
                if time.monotonic() - start > 6:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, _ = _read_until_closed(sock)
        took = time.monotonic() - start
    status, headers, body = _split(data)
    assert status == 408 and headers["content-type"].startswith("application/json")
    assert "headerTimeoutSeconds" in json.loads(body)["message"]
    assert len(headers["x-trace-id"]) == 32 and headers["x-request-id"] == headers["x-trace-id"]
    assert took < 5


def test_slowloris_body_is_answered_408_and_closed(start_server):
    server = start_server(*LIMITS)
    with _connect(server) as sock:
        sock.sendall(b"POST /serverless/v1/functions/echo/invocations HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":")
        data, took = _read_until_closed(sock)
    status, _headers, body = _split(data)
    assert status == 408 and "bodyTimeoutSeconds" in json.loads(body)["message"]
    assert took < 5


def test_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not(start_server):
    server = start_server(*LIMITS)
    with _connect(server) as sock:
        for _ in range(4):  # requests 0.5 s apart keep it open past the 1 s timeout
            sock.sendall(_get())
            status, _, _ = _split(sock.recv(65536))
            assert status == 200
            time.sleep(0.5)
        data, took = _read_until_closed(sock)  # then idle: closed about a second after the last answer
    assert data == b"" and took < 3


def test_too_large_header_is_answered_431_json(start_server):
    server = start_server("-s", "frontend.limits.maxHeaderFieldSize=1024")
    with _connect(server) as sock:
        sock.sendall(_get(extra=f"X-Big: {'a' * 2000}\r\n"))
        data, _ = _read_until_closed(sock)
    status, headers, body = _split(data)
    assert status == 431 and headers["content-type"].startswith("application/json")
    assert json.loads(body)["code"] == 431000
    with _connect(server) as sock:  # the limit is per line: many small ones past maxHeaders too
        sock.sendall(_get(extra="".join(f"X-H{i}: v\r\n" for i in range(200))))
        assert _split(_read_until_closed(sock)[0])[0] == 431


def _unfinished_head(total: int) -> bytes:
    """A request line and headers of about `total` bytes, each field small, the final CRLF missing."""
    fields = "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(total // 1012))
    return f"GET /healthz HTTP/1.1\r\nHost: localhost\r\n{fields}".encode()


def test_an_unfinished_head_past_max_header_bytes_is_answered_431(start_server):
    # Every field is within maxHeaderFieldSize and their number within maxHeaders: only the bytes of
    # the head as a whole, counted while they arrive, bound what one client holds before auth.
    server = start_server("-s", "frontend.limits.maxHeaderBytes=16384", "-s", "frontend.limits.maxHeaders=100")
    head = _unfinished_head(30000)
    with _connect(server) as sock:
        try:
            for i in range(0, len(head), 4096):
                sock.sendall(head[i:i + 4096])
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, _ = _read_until_closed(sock)
    status, headers, body = _split(data)
    assert status == 431 and headers["content-type"].startswith("application/json")
    assert "maxHeaderBytes" in json.loads(body)["message"]
    with _connect(server) as sock:  # a head within the bound, finished, is served
        sock.sendall(_unfinished_head(12000) + b"\r\n")
        assert _split(sock.recv(65536))[0] == 200


def test_unfinished_heads_across_connections_are_bounded_and_released(start_server):
    server = start_server("-s", "frontend.limits.maxHeaderBytesInFlight=65536",
                          "-s", "frontend.limits.maxHeaderBytes=40000", "-s", "frontend.limits.maxHeaders=100")
    socks = [_connect(server) for _ in range(3)]
    try:
        for sock in socks:  # 3 x 30 KB held at once: the one whose bytes pass 64 KiB is refused
            sock.sendall(_unfinished_head(30000))
        readable, _, _ = select.select(socks, [], [], 10)
        assert len(readable) == 1
        refused = readable[0]
        status, _, body = _split(_read_until_closed(refused)[0])
        assert status == 503 and "maxHeaderBytesInFlight" in json.loads(body)["message"]
        for sock in socks:  # the others were held, not refused: finished, they are served
            if sock is not refused:
                sock.sendall(b"\r\n")
                assert _split(sock.recv(65536))[0] == 200
        with _connect(server) as sock:  # what they held was given back
            sock.sendall(_unfinished_head(30000))
            sock.sendall(b"\r\n")
            assert _split(sock.recv(65536))[0] == 200
    finally:
        for sock in socks:
            sock.close()


def test_connections_past_the_cap_get_503_json_and_the_held_ones_still_work(start_server):
    server = start_server("-s", "frontend.limits.maxConnections=3", "-s", "frontend.limits.keepAliveSeconds=30")
    held = [_connect(server) for _ in range(3)]
    try:
        for sock in held:  # each one accepted and served
            sock.sendall(_get())
            assert _split(sock.recv(65536))[0] == 200
        with _connect(server) as extra:
            extra.sendall(_get())
            data, _ = _read_until_closed(extra)
        status, headers, body = _split(data)
        assert status == 503 and headers["retry-after"] == "1" and headers["traceparent"].startswith("00-")
        assert "maxConnections" in json.loads(body)["message"]
        held[0].sendall(_get())  # the held connections are untouched
        assert _split(held[0].recv(65536))[0] == 200
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while True:  # once they are closed, new connections are served again
        with _connect(server) as sock:
            sock.sendall(_get())
            if _split(sock.recv(65536))[0] == 200:
                break
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_sse_stream_longer_than_every_timeout_runs_to_its_end(start_server, loop):
    import aiohttp

    server = start_server(*LIMITS, "-s", f"frontend.loop={loop}")
    async with aiohttp.ClientSession() as session, session.post(
            server.url + "/serverless/v1/functions/ticker/invocations", json={"count": 3, "delay_ms": 1500},
            headers={"Accept": "text/event-stream"}) as resp:
        assert resp.status == 200
        events = await read_events(resp)
    data = [json.loads(ev["data"]) if ev["data"] != "[DONE]" else ev["data"] for _t, ev in events]
    assert data == [{"tick": 1, "of": 3}, {"tick": 2, "of": 3}, {"tick": 3, "of": 3}, {"ticks": 3}, "[DONE]"]
    # Gaps of 1.5 s, each longer than the 1 s timeouts: the events arrived apart, as written.
    assert events[2][0] - events[0][0] > 2.5
    assert f"{loop} loop" in server.output()


def _listen_backlog(port: int) -> int:
    """Send-Q of a listening socket, as `ss` shows it, is its accept backlog."""
    import shutil
    import subprocess

    if not shutil.which("ss"):
        pytest.skip("ss (iproute2) not installed")
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[2])


def test_listener_backlog_is_frontend_backlog(start_server):
    from pathlib import Path

    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    default = start_server()
    assert _listen_backlog(default.port) == min(2048, somaxconn)
    assert "uvloop loop" in default.output()  # frontend.loop: auto picks the declared dependency
    small = start_server("-s", "frontend.backlog=64")
    assert _listen_backlog(small.port) == 64


def test_malformed_request_is_answered_400_json_not_a_text_page(start_server):
    server = start_server()
    with _connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = _split(_read_until_closed(sock)[0])
    assert status == 400 and headers["content-type"].startswith("application/json")
    assert json.loads(body)["code"] == 200400
    assert len(headers["x-trace-id"]) == 32  # a trace id of its own, as every answer has
    with _connect(server) as sock:
        sock.sendall(_get(extra=f"X-Big: {'a' * 9000}\r\n"))
        assert _split(_read_until_closed(sock)[0])[0] == 431
    # The client's doing, which anyone can send: no ERROR line with a traceback per request.
    assert "Traceback" not in server.output() and "ERROR" not in server.output()


async def test_a_body_arriving_before_its_request_task_runs_arms_no_header_timeout():
    """The turn after a request head is parsed, aiohttp has taken it off its queue but its task has
    not started yet: body bytes read then are the request's, not the start of a next head. A header
    timer armed there fired later on the idle keep-alive connection: an unasked-for 408, then close."""
    import asyncio

    from frontend.app import SERVER_KWARGS, build_app
    from frontend.server import FnstreamRunner, start_site
    from tests.support.servers import free_port, make_config

    config = make_config(**{"frontend.limits.headerTimeoutSeconds": 0.3, "frontend.limits.keepAliveSeconds": 30})
    runner = FnstreamRunner(build_app(config), config.frontend.limits, shutdown_timeout=1, **SERVER_KWARGS)
    await runner.setup()
    port = free_port()
    await start_site(runner, config, "127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while not runner.server.connections:
            await asyncio.sleep(0.01)
        handler = runner.server.connections[0]
        body = b'{"a": 1}'
        # Fed straight to the connection's protocol, so the loop turn each part lands in is certain.
        handler.data_received(b"POST /serverless/v1/functions/echo/invocations HTTP/1.1\r\nHost: localhost\r\n"
                              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        while handler._messages:                 # aiohttp's loop took the request; its task has not run
            await asyncio.sleep(0)
        handler.data_received(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = _split(head)[1]["content-length"]
        assert json.loads(await reader.readexactly(int(length))) == {"a": 1}
        try:
            with pytest.raises(TimeoutError):    # the idle keep-alive connection stays quiet and open
                await asyncio.wait_for(reader.read(1), 1.0)
        finally:
            writer.close()
    finally:
        await runner.cleanup()


def _post_gzip(body: bytes, encoding: str = "gzip") -> bytes:
    return (b"POST /serverless/v1/functions/echo/invocations HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Encoding: " + encoding.encode() +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_a_gzip_bomb_is_refused_413_and_its_connection_closed_unread(start_server):
    """A small compressed body that inflates past maxRequestBodySize: 413, and the connection closes
    after it. It used to stay open while aiohttp's lingering close read, and inflated on the event
    loop, the rest of the bomb (seconds of CPU for 4 MB of gzip)."""
    import gzip

    server = start_server("-s", "frontend.args.maxRequestBodySize=0.01",
                          "-s", "frontend.limits.keepAliveSeconds=30")
    bomb = gzip.compress(b'{"a":"' + b"0" * (64 * 1024 * 1024) + b'"}', compresslevel=9)  # 64 MB in ~64 kB
    with _connect(server) as sock:
        try:
            sock.sendall(_post_gzip(bomb))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed before it read everything: what this asks for
        data, took = _read_until_closed(sock, limit=30)
    status, _headers, body = _split(data)
    assert status == 413 and json.loads(body)["code"] == 4140
    assert took < 8  # not aiohttp's 10 s lingering read of the rest


def test_a_corrupt_compressed_body_is_400_not_500(start_server):
    server = start_server()
    for encoding in ("gzip", "deflate"):
        with _connect(server) as sock:
            sock.sendall(_post_gzip(b"\x1f\x8b" + b"x" * 8, encoding))
            status, _headers, body = _split(_read_until_closed(sock)[0])
        assert status == 400 and json.loads(body)["code"] == 200400, body
        assert "could not be read" in json.loads(body)["message"]
    assert "Traceback" not in server.output()


def _echo_request(size: int) -> bytes:
    body = json.dumps({"pad": "x" * size}).encode()
    return (b"POST /serverless/v1/functions/echo/invocations HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _small_receiver(server) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.port))
    return sock


def test_a_client_that_takes_none_of_its_response_is_aborted_after_the_send_timeout(start_server):
    """It used to hold its connection (and the response, and a maxConnections slot) for ever."""
    server = start_server("-s", "frontend.limits.sendTimeoutSeconds=1", "-s", "frontend.limits.keepAliveSeconds=30")
    size = 4 * 1024 * 1024
    with _small_receiver(server) as sock:
        sock.sendall(_echo_request(size))
        time.sleep(4)  # reads nothing for four send timeouts
        data, _ = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200") and len(data) < size  # cut short: the server aborted it
    assert "sendTimeoutSeconds" in server.output()


def test_a_slow_reader_that_keeps_taking_is_never_cut(start_server):
    """About 3 kB/s, steadily, from a stream far larger than the kernel's send queue: the transport's
    own buffer stays full for minutes while the client reads (the kernel holds megabytes in between),
    so progress is what the client's TCP acknowledged, not what left the transport."""
    # 3 s: a receive window this small reopens in steps of about half of it (a second or more here)
    server = start_server("-s", "frontend.limits.sendTimeoutSeconds=3", "-s", "frontend.limits.keepAliveSeconds=30")
    body = json.dumps({"count": 200000, "delay_ms": 0}).encode()
    with _small_receiver(server) as sock:
        sock.sendall(b"POST /serverless/v1/functions/ticker/invocations HTTP/1.1\r\nHost: localhost\r\n"
                     b"Accept: text/event-stream\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got, start = 0, time.monotonic()
        while time.monotonic() - start < 9:  # three send timeouts
            chunk = sock.recv(300)
            assert chunk, f"cut after {got} bytes"
            got += len(chunk)
            time.sleep(0.1)
    assert "sendTimeoutSeconds" not in server.output()


def test_a_pipelined_request_whose_body_waits_behind_a_long_one_is_answered(start_server):
    """Its whole body was sent; the server stopped reading it (its buffer full) while the request
    ahead ran longer than bodyTimeoutSeconds. The client was not slow: it used to be dropped (RST)."""
    server = start_server(*LIMITS, "-s", "frontend.limits.keepAliveSeconds=30")
    first = b'{"count": 3, "delay_ms": 1000}'  # about 2 s, past the 1 s body timeout
    second = json.dumps({"x": "a" * (1 << 20)}).encode()
    requests = (b"POST /serverless/v1/functions/ticker/invocations HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Length: " + str(len(first)).encode() + b"\r\n\r\n" + first +
                b"POST /serverless/v1/functions/echo/invocations HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(second)).encode() + b"\r\n\r\n" + second)
    with _connect(server) as sock:
        sock.sendall(requests)
        data, _ = _read_until_closed(sock, limit=30)
    assert data.count(b"HTTP/1.1 200 OK") == 2, data[:300]
    assert json.loads(data.rpartition(b"\r\n\r\n")[2]) == {"x": "a" * (1 << 20)}


def test_an_ordinary_client_uploading_too_large_a_body_reads_its_413(start_server):
    """An identity-encoded body is drained after the 413 as aiohttp does (closing with unread bytes
    would reset the connection under a client still sending: it saw a reset, not the answer)."""
    import urllib.error
    import urllib.request

    server = start_server("-s", "frontend.args.maxRequestBodySize=1")
    body = json.dumps({"pad": "x" * (8 * 1024 * 1024)}).encode()
    request = urllib.request.Request(server.url + "/serverless/v1/functions/echo/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413 and json.loads(refused.value.read())["code"] == 4140
