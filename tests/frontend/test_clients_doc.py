"""docs/clients.md runs as written: every block marked `<!-- test: NAME -->` is taken from the page
and run against a real server (its address in place of the page's http://127.0.0.1:8888), so the
page cannot go stale. Python blocks run in a subprocess of this interpreter, shell blocks in bash,
the npm block in node, browser blocks in Debian's chromium (playwright)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.support.servers import ROOT, ServerProcess

PAGE = (ROOT / "docs" / "clients.md").read_text()
PLACEHOLDER = "http://127.0.0.1:8888"
BLOCKS: dict[str, str] = {name: code for name, code in re.findall(
    r"^<!-- test: ([\w-]+) -->\n```\w*\n(.*?)^```$", PAGE, flags=re.M | re.S)}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def block(name: str, url: str) -> str:
    assert PLACEHOLDER in BLOCKS[name] or name.startswith("yr-"), f"{name} does not name the server"
    return BLOCKS[name].replace(PLACEHOLDER, url)


def run(argv: list[str], cwd: Path | None = None, timeout: float = 60) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run_python(name: str, url: str) -> str:
    return run([sys.executable, "-c", block(name, url)])


def test_every_marked_block_is_run_here():
    tested = {"runpod", "openai-python", "openai-node", "langchain", "litellm", "yr-handler", "yr-manifest",
              "yr-curl", "curl", "browser-fetch", "browser-eventsource"}
    assert set(BLOCKS) == tested
    assert PAGE.count("\n<!-- test: ") == len(BLOCKS), "a marker not followed by a fenced block"


def test_runpod_sdk(server):
    out = run_python("runpod", server.url).splitlines()
    assert "'input': {'word': 'hi'}" in out[0]
    assert [json.loads(line.split(" ", 1)[1]) for line in out if line.startswith("item ")] == [
        {"tick": i, "of": 5} for i in range(1, 6)]
    assert out[-1] == "COMPLETED {'ticks': 5}"


def test_openai_python_tokens_arrive_while_written(server):
    """The stand-in writes 40 tokens a second: printed arrival times spread over the writing, where a
    buffered answer would print them all at once."""
    lines = run_python("openai-python", server.url).splitlines()
    arrivals = [float(line.split(" ", 1)[0]) for line in lines]
    assert len(arrivals) >= 5
    writing = (len(arrivals) - 1) / 40
    assert arrivals[-1] - arrivals[0] >= writing / 2, "tokens came in one burst"


@pytest.fixture(scope="module")
def npm_openai(tmp_path_factory) -> Path:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("needs node and npm")
    where = tmp_path_factory.mktemp("npm-openai")
    (where / "package.json").write_text('{"name": "clients-doc", "private": true, "type": "module"}')
    done = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "openai"], cwd=where,
                          capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        pytest.skip(f"npm install openai failed: {done.stderr[-300:]}")
    return where


def test_openai_node(server, npm_openai):
    (npm_openai / "chat.mjs").write_text(block("openai-node", server.url))
    out = run(["node", "chat.mjs"], cwd=npm_openai)
    assert len(out.strip()) > 0


@pytest.mark.skipif(find_spec("langchain_openai") is None, reason="needs langchain-openai (the test extra)")
def test_langchain_openai(server):
    invoked, streamed = run_python("langchain", server.url).splitlines()
    assert invoked and streamed == invoked  # the stand-in writes the same answer to the same prompt


@pytest.mark.skipif(find_spec("litellm") is None, reason="needs litellm (the test extra)")
def test_litellm(server):
    completed, streamed = run_python("litellm", server.url).splitlines()[-2:]
    assert completed and streamed == completed


def test_yr_handler_produces_a_stream_curl_reads(tmp_path):
    (tmp_path / "functions").mkdir()
    (tmp_path / "deploy").mkdir()
    (tmp_path / "functions" / "prices.py").write_text(BLOCKS["yr-handler"])
    (tmp_path / "deploy" / "prices.yaml").write_text(BLOCKS["yr-manifest"])
    server = ServerProcess("-s", f"runtime.codeRoots={json.dumps([str(tmp_path / 'functions')])}",
                           "--deploy-dir", str(tmp_path / "deploy"))
    try:
        out = run(["bash", "-c", block("yr-curl", server.url)], timeout=30)
    finally:
        server.stop()
    answer, events = out.split("\n", 1)
    assert json.loads(answer) == "sent"
    assert re.findall(r"^data: (.*)$", events, flags=re.M) == ["7", "8", "9", "[DONE]"]


def test_curl_events_arrive_while_written(server):
    """Lines read from curl's stdout as it prints them: the ticks come in 200 ms apart, not at the end."""
    with subprocess.Popen(["bash", "-c", block("curl", server.url)], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        arrivals = [(time.monotonic(), line.strip().removeprefix("data: ")) for line in proc.stdout
                    if line.startswith("data: ")]
        assert proc.wait(30) == 0
    assert [data for _, data in arrivals] == [*(json.dumps({"tick": i, "of": 5}, separators=(",", ":"))
                                                for i in range(1, 6)), '{"ticks":5}', "[DONE]"]
    assert arrivals[4][0] - arrivals[0][0] >= 0.4, "the five ticks (four 200 ms sleeps apart) came at once"


@pytest.fixture
def page(server):
    if not shutil.which("chromium"):
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(server.url + "/console/")
        yield page
        browser.close()


def _console(page) -> list[str]:
    logged: list[str] = []
    page.on("console", lambda m: logged.append(m.text) if m.type == "log" else None)
    return logged


def _wait_logged(page, logged: list[str], done) -> None:
    """Console messages reach playwright asynchronously: wait for the last one expected."""
    deadline = time.monotonic() + 15
    while not done() and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert done(), logged


def test_browser_fetch_reader_shows_events_as_they_arrive(page, server):
    logged = _console(page)
    page.evaluate("async () => {\n" + block("browser-fetch", server.url) + "\n}")
    _wait_logged(page, logged, lambda: any(line.endswith("[DONE]") for line in logged))
    arrivals = [(int(ms), data) for ms, data in (line.split(" ", 1) for line in logged)]
    assert [data for _, data in arrivals][-2:] == ['{"ticks":5}', "[DONE]"]
    ticks = [ms for ms, data in arrivals if '"tick"' in data]
    assert len(ticks) == 5
    assert ticks[-1] - ticks[0] >= 400, "the five ticks (four 200 ms sleeps apart) came at once"


def test_browser_eventsource(page, server):
    logged = _console(page)
    page.evaluate("() => {\n" + block("browser-eventsource", server.url) + "\n}")
    _wait_logged(page, logged, lambda: len(logged) >= 3)
    assert logged == ["1 hello", "2 world", "3 bye"]
