"""`fnstream invoke --stream` and `subscribe` draw a live status line only on a terminal: through
a pseudo-terminal the output carries a spinner and a line count; through a pipe, only the lines."""
import os
import pty
import select
import subprocess
import sys
import threading
import time

from tests.support.servers import ROOT


def run_on_pty(*args: str) -> str:
    """Run the CLI with stdout on a pseudo-terminal (stderr to a pipe) and return what it drew."""
    master, slave = pty.openpty()
    out = b""
    try:
        # The with block closes the stderr pipe and reaps the child (killed if it outlives the test).
        with subprocess.Popen([sys.executable, "-m", "frontend.cli", *args], cwd=ROOT, stdout=slave,
                              stderr=subprocess.PIPE) as proc:
            os.close(slave)
            try:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    ready, _, _ = select.select([master], [], [], 0.5)
                    if ready:
                        try:
                            chunk = os.read(master, 65536)
                        except OSError:  # the child closed the terminal
                            break
                        if not chunk:
                            break
                        out += chunk
                    elif proc.poll() is not None:
                        break
                proc.wait(10)
            finally:
                if proc.poll() is None:
                    proc.kill()
            errors = proc.stderr.read()
    finally:
        os.close(master)
    assert proc.returncode == 0, errors
    return out.decode()


def test_invoke_stream_shows_a_live_count_on_a_terminal_only(server):
    args = ("invoke", "ticker", "--stream", "--data", '{"count": 3, "delay_ms": 300}', "--url", server.url)
    drawn = run_on_pty(*args)
    assert "ticker: 0 lines" in drawn and "ticker: 3 lines" in drawn
    assert '{"tick":3,"of":3}' in drawn and "\r\x1b[K" in drawn
    assert drawn.endswith("\r\x1b[K")  # the status line is cleared at the end
    piped = subprocess.run([sys.executable, "-m", "frontend.cli", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=30)
    assert piped.returncode == 0
    assert piped.stdout.splitlines() == ['{"tick":1,"of":3}', '{"tick":2,"of":3}', '{"tick":3,"of":3}',
                                         '{"ticks":3}', "[DONE]"]
    assert "\x1b" not in piped.stdout + piped.stderr


def test_subscribe_shows_a_live_count_on_a_terminal(server):
    procs = []

    def produce() -> None:  # after the subscriber is attached: elements are not retained
        procs.append(subprocess.Popen([sys.executable, "-m", "frontend.cli", "invoke", "stream-producer", "--url",
                                       server.url, "--data", '{"stream": "tty-demo", "count": 3, "delay_ms": 300}'],
                                      cwd=ROOT, stdout=subprocess.DEVNULL))

    timer = threading.Timer(1.5, produce)
    timer.start()
    try:
        drawn = run_on_pty("subscribe", "tty-demo", "--url", server.url, "--timeout-ms", "20000")
    finally:
        timer.join()
        for p in procs:
            p.wait(30)
    assert "tty-demo: 0 lines" in drawn and "tty-demo: 3 lines" in drawn and "\r\x1b[K" in drawn
