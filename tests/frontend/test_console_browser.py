"""The web console in a real headless Chromium (Debian's `chromium`, driven by playwright; no
browser is ever downloaded): panels, live streaming with arrival times, Stop, subscriptions,
instance sessions, and a page on another origin (frontend.cors) streaming through fetch and EventSource."""
import json
import shutil
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.servers import free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not shutil.which("chromium"),
                                reason="needs Debian's chromium (apt-get install chromium)")
sync_api = pytest.importorskip("playwright.sync_api")

BUNDLED = {"chat", "echo", "hello", "stream-consumer", "stream-producer", "ticker"}


@pytest.fixture
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def _page(browser, problems: list[str]):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    return page


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _inflight(server, name: str) -> int:
    return _get(f"{server.url}/admin/v1/functions/{name}")["function"]["status"]["inflight"]


def _open_session(server, function: str, session_id: str, event: dict, stream: bool = False) -> str:
    """One turn of an X-Instance-Session (TTL 300 s); the answer's body."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json",
               "X-Instance-Session": json.dumps({"sessionID": session_id, "sessionTTL": 300})}
    req = urllib.request.Request(f"{server.url}/serverless/v1/functions/{function}/invocations",
                                 data=json.dumps(event).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def test_console_panels_stream_live_stop_and_subscribe(browser, server, tmp_path):
    problems: list[str] = []
    page = _page(browser, problems)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(server.url + "/")
    assert page.url == server.url + "/console/"

    # Functions: the bundled ones, with their status.
    page.wait_for_selector("#functions-table tbody tr[data-name=ticker]")
    names = set(page.eval_on_selector_all("#functions-table tbody tr", "rows => rows.map(r => r.dataset.name)"))
    assert names >= BUNDLED
    page.click("#functions-table tr[data-name=hello] button:text('manifest')")
    page.wait_for_function("() => document.getElementById('manifest-view').textContent.includes('hello.handler')")
    page.screenshot(path=str(tmp_path / "console-functions.png"), full_page=True)

    # Invoke ticker 5 x 300 ms as a stream: the first event is on the page long before the last
    # can have been produced (the function sleeps 4 x 300 ms after the request reached it).
    page.click("#tabs button[data-panel=invoke]")
    page.select_option("#invoke-fn", "ticker")
    page.select_option("#invoke-mode", "stream")
    page.fill("#invoke-event", json.dumps({"count": 5, "delay_ms": 300}))
    page.click("#invoke-send")
    page.wait_for_selector("#invoke-events li")
    shown_when_first_seen = page.eval_on_selector_all("#invoke-events li", "l => l.length")
    page.wait_for_selector("#invoke-events li:has-text('[DONE]')", timeout=15000)
    arrivals = page.eval_on_selector_all("#invoke-events li", "l => l.map(e => [Number(e.dataset.ms), e.textContent])")
    assert shown_when_first_seen < 5
    assert '{"tick":1,"of":5}' in arrivals[0][1]
    ticks = [ms for ms, text in arrivals if '"tick"' in text]
    assert len(ticks) == 5
    assert ticks[0] < 4 * 300, arrivals  # shown before the last tick was produced
    assert ticks[-1] >= 4 * 300 - 50 and ticks[-1] - ticks[0] >= 3 * 300, arrivals  # spread out, as produced
    assert json.loads(page.text_content("#invoke-result")) == {"ticks": 5}
    trace = page.text_content("#invoke-trace")
    assert len(trace) == 32 and page.text_content("#invoke-status").startswith("200")
    page.screenshot(path=str(tmp_path / "console-invoke.png"), full_page=True)

    # Stop cancels the function: inflight goes back to 0.
    page.fill("#invoke-event", json.dumps({"count": 1000, "delay_ms": 100}))
    page.click("#invoke-send")
    page.wait_for_function("() => document.querySelectorAll('#invoke-events li').length >= 2")
    assert _inflight(server, "ticker") == 1
    page.click("#invoke-stop")
    page.wait_for_function("() => document.getElementById('invoke-status').textContent.startsWith('stopped')")
    deadline = time.monotonic() + 5
    while _inflight(server, "ticker") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _inflight(server, "ticker") == 0
    assert page.eval_on_selector_all("#invoke-history li", "l => l.length") == 2
    page.click("#tabs button[data-panel=functions]")
    page.wait_for_function("() => document.querySelector("
                           "'#functions-table tr[data-name=ticker] td[data-field=inflight]').textContent === '0'")

    # Streams: a subscription shows what is published, as it is published.
    page.click("#tabs button[data-panel=streams]")
    page.fill("#sub-name", "console-demo")
    page.click("#sub-start")
    page.wait_for_function("() => document.getElementById('sub-state').textContent.startsWith('subscribed')")
    page.fill("#pub-name", "console-demo")
    for text in ("first element", "second element"):
        page.fill("#pub-text", text)
        page.click("#pub-send")
        page.wait_for_selector(f"#sub-elements li:has-text('{text}')")
    page.wait_for_selector("#streams-table tr[data-name=console-demo]")
    page.screenshot(path=str(tmp_path / "console-streams.png"), full_page=True)
    page.click("#sub-stop")

    # Metrics, jobs, sessions, API docs.
    page.click("#tabs button[data-panel=metrics]")
    page.wait_for_selector("#metrics-table tr[data-metric=fnstream_invocations_total]")
    for _ in range(3):  # traffic while the live chart runs
        for _ in range(10):
            req = urllib.request.Request(server.url + "/serverless/v1/functions/hello/invocations", data=b"{}")
            urllib.request.urlopen(req, timeout=5).close()
        page.wait_for_timeout(700)
    page.wait_for_function("() => state.metrics.points.some(p => p.inv > 0)")
    page.screenshot(path=str(tmp_path / "console-metrics.png"), full_page=True)
    req = urllib.request.Request(server.url + "/serverless/v1/functions/hello/invocations", data=b"{}",
                                 headers={"X-Invoke-Type": "async"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        job_id = json.loads(resp.read())["requestId"]
    page.click("#tabs button[data-panel=jobs]")
    page.wait_for_selector(f"#jobs-table tr[data-id='{job_id}'][data-status=COMPLETED]")  # the 2 s refresh
    page.screenshot(path=str(tmp_path / "console-jobs.png"), full_page=True)
    page.click("#tabs button[data-panel=metrics]")  # the job just finished is counted at a glance
    page.wait_for_selector("#metrics-table tr[data-metric='fnstream_jobs:completed']")
    assert page.text_content("#metrics-table tr[data-metric='fnstream_jobs:completed'] td.num") == "1"

    # Sessions: opened by invocations with X-Instance-Session, listed; interrupt stops a running
    # turn (its stream ends with the error event); delete ends a session.
    _open_session(server, "hello", "console-s1", {})
    turn: dict[str, str] = {}
    long_turn = threading.Thread(target=lambda: turn.update(body=_open_session(
        server, "ticker", "console-s2", {"count": 1000, "delay_ms": 100}, stream=True)), daemon=True)
    long_turn.start()
    page.click("#tabs button[data-panel=sessions]")
    page.wait_for_selector("#sessions-table tr[data-session=console-s1]")
    page.wait_for_selector("#sessions-table tr[data-session=console-s2][data-running='1']")
    cells = page.eval_on_selector_all("#sessions-table tr[data-session=console-s1] td",
                                      "tds => tds.map(td => td.textContent)")
    assert cells[:4] == ["hello", "console-s1", "1", "0"] and cells[5] == "300", cells
    assert cells[7] == "(in-process)", cells
    page.screenshot(path=str(tmp_path / "console-sessions.png"), full_page=True)
    page.click("#sessions-table tr[data-session=console-s2] button:text('interrupt')")
    long_turn.join(15)
    assert not long_turn.is_alive() and "was interrupted" in turn["body"] and "[DONE]" in turn["body"], turn
    page.wait_for_function("() => document.getElementById('sessions-result').textContent.includes('\"interrupted\":1')")
    page.click("#sessions-table tr[data-session=console-s1] button:text('delete')")
    page.wait_for_selector("#sessions-table tr[data-session=console-s1]", state="detached")
    listed = _get(f"{server.url}/admin/v1/functions/hello")["function"]["status"]["sessions"]
    assert listed == []
    page.click("#tabs button[data-panel=apidocs]")
    page.wait_for_selector("details.op[data-path='/serverless/v1/functions/{ref}/invocations']")
    page.click("details.op[data-path='/serverless/v1/functions/{ref}/invocations'] summary")
    page.screenshot(path=str(tmp_path / "console-apidocs.png"), full_page=True)
    assert problems == []
    # Offline-ready: everything the page loaded or called came from this server (no CDN).
    assert requested and all(u.startswith(server.url + "/") or u.startswith("data:") for u in requested), \
        sorted({u for u in requested if not u.startswith(server.url)})
    page.close()


def test_console_asks_for_the_token_and_keeps_it_in_the_tab(browser, start_server, tmp_path):
    server = start_server("-s", 'auth.tokens=[{"token": "dev-secret", "role": "developer"}]')
    problems: list[str] = []
    page = _page(browser, problems)
    page.goto(server.url + "/console/")
    page.wait_for_selector("#token-dialog[open]")
    page.screenshot(path=str(tmp_path / "console-token.png"))
    page.fill("#token-input", "dev-secret")
    page.click("#token-ok")
    page.wait_for_selector("#functions-table tbody tr[data-name=ticker]")
    assert page.evaluate("sessionStorage.getItem('fnstream.token')") == "dev-secret"
    page.reload()  # same tab: no prompt again
    page.wait_for_selector("#functions-table tbody tr[data-name=ticker]")
    assert not page.is_visible("#token-dialog")
    assert problems == []


CROSS_ORIGIN_PAGE = """<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,"><title>other origin</title>
<script>
window.results = {events: [], elements: [], errors: []};
async function streamByFetch(base) {
  const started = performance.now();
  const resp = await fetch(base + "/serverless/v1/functions/ticker/invocations", {
    method: "POST", headers: {"Content-Type": "application/json", "Accept": "text/event-stream"},
    body: JSON.stringify({count: 5, delay_ms: 300})});
  window.results.status = resp.status;
  window.results.trace = resp.headers.get("X-Trace-Id");
  const reader = resp.body.getReader(); const decoder = new TextDecoder(); let buf = "";
  for (;;) {
    const {value, done} = await reader.read(); if (done) break;
    buf += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buf.indexOf("\\n\\n")) >= 0) {
      const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
      const data = block.split("\\n").filter(l => l.startsWith("data: ")).map(l => l.slice(6)).join("\\n");
      window.results.events.push([performance.now() - started, data]);
    }
  }
  window.results.fetchDone = true;
}
function subscribe(base, name) {
  const source = new EventSource(base + "/serverless/v1/streams/" + name);
  source.onopen = () => { window.results.open = true; };
  source.onmessage = (e) => { window.results.elements.push(e.data); if (e.data === "[DONE]") source.close(); };
}
</script>"""


@pytest.fixture
def other_origin():
    """A page served from another origin (another port) than fnstream's."""
    port = free_port()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            body = CROSS_ORIGIN_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Page)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{port}"
    httpd.shutdown()
    httpd.server_close()


def test_page_on_an_allowed_origin_streams_through_fetch_and_eventsource(browser, start_server, other_origin, tmp_path):
    server = start_server("-s", f'frontend.cors.allowOrigins=["{other_origin}"]')
    problems: list[str] = []
    page = _page(browser, problems)
    page.goto(other_origin + "/")
    page.evaluate("base => { streamByFetch(base); }", server.url)  # not awaited
    page.wait_for_function("() => window.results.events.length >= 1")
    early = page.evaluate("window.results.events.length")
    page.wait_for_function("() => window.results.fetchDone === true", timeout=15000)
    results = page.evaluate("window.results")
    assert results["status"] == 200 and len(results["trace"]) == 32  # exposed header readable cross-origin
    ticks = [ms for ms, data in results["events"] if '"tick"' in data]
    assert early < 5 and len(ticks) == 5
    assert ticks[0] < 4 * 300 and ticks[-1] - ticks[0] >= 3 * 300, results["events"]
    assert results["events"][-1][1] == "[DONE]"

    page.evaluate("([base, name]) => subscribe(base, name)", [server.url, "cross-origin-demo"])
    page.wait_for_function("() => window.results.open === true")
    req = urllib.request.Request(server.url + "/serverless/v1/streams/cross-origin-demo",
                                 data=json.dumps(["one", "two", "[DONE]"]).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).close()
    page.wait_for_function("() => window.results.elements.includes('[DONE]')")
    assert page.evaluate("window.results.elements") == ["one", "two", "[DONE]"]
    page.screenshot(path=str(tmp_path / "cross-origin.png"))
    assert problems == []


def test_a_generators_last_item_is_not_shown_as_its_result(browser, start_server, tmp_path):
    from tests.support.servers import FUNCTIONS, HANDLERS
    server = start_server("-s", f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(HANDLERS)])}",
                          "-s", "frontend.args.enableEvent=true")
    manifest = {"name": "counting", "handler": "testfns.gen", "codePath": str(HANDLERS)}
    req = urllib.request.Request(f"{server.url}/admin/v1/functions", data=json.dumps(manifest).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 201
    problems: list[str] = []
    page = _page(browser, problems)
    page.goto(server.url + "/console/")
    page.wait_for_selector("#functions-table tbody tr[data-name=counting]")
    page.click("#tabs button[data-panel=invoke]")
    for fn, event, result in (("counting", {"n": 3}, "no result"), ("hello", {}, '"ok"')):
        page.select_option("#invoke-fn", fn)
        page.select_option("#invoke-mode", "stream")
        page.fill("#invoke-event", json.dumps(event))
        page.click("#invoke-send")
        page.wait_for_selector("#invoke-events li:has-text('[DONE]')", timeout=15000)
        page.wait_for_function("() => document.getElementById('invoke-send').disabled === false")
        assert page.text_content("#invoke-result") == result, fn  # a generator sends no result event
    assert not problems, problems
