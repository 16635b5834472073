// fnstream web console: plain JavaScript, no build step, no external resources (works offline).
// Every API call goes to the server that served this page, relative to it (so a reverse proxy
// path prefix keeps working), with the tab's token (sessionStorage) when auth is on.
"use strict";

const BASE = new URL("..", location.href);
const TOKEN_KEY = "fnstream.token";
const HISTORY_KEY = "fnstream.invokeHistory";
const HISTORY_SIZE = 10;
const $ = (id) => document.getElementById(id);

const state = { authOn: false, functions: [], panel: "functions", timers: [], invoke: null, invokeId: null,
                subscription: null, metrics: { last: null, points: [] } };

// -- API access -------------------------------------------------------------------------------
function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
function apiUrl(path) { return new URL(path.replace(/^\//, ""), BASE).toString(); }
function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  if (token()) headers.Authorization = "Bearer " + token();
  return headers;
}

async function api(method, path, opts) {
  const o = opts || {};
  const init = { method, headers: authHeaders({ Accept: o.accept || "application/json" }) };
  if (o.body !== undefined) {
    init.body = o.body;
    init.headers["Content-Type"] = o.type || "application/json";
  }
  const resp = await fetch(apiUrl(path), init);
  const text = await resp.text();
  let data = text;
  try { data = JSON.parse(text); } catch (_) { /* not JSON: keep the text */ }
  if (resp.status === 401 && state.authOn) askToken("The server refused the token: " + errorText(data));
  return { status: resp.status, ok: resp.ok, data, headers: resp.headers };
}

function errorText(data) {
  if (data && typeof data === "object") {
    if (data.error && data.error.message) return data.error.message;
    if (data.message) return (data.code ? data.code + ": " : "") + data.message;
  }
  return typeof data === "string" ? data : JSON.stringify(data);
}

// -- token ------------------------------------------------------------------------------------
function askToken(message) {
  const dialog = $("token-dialog");
  $("token-error").textContent = message || "";
  if (!dialog.open) dialog.showModal();
}

$("token-form").addEventListener("submit", () => {
  sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
  $("token-input").value = "";
  showWho();
  refreshPanel();
});
$("logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); showWho(); askToken(""); });

function showWho() {
  $("whoami").textContent = state.authOn ? (token() ? "token set (this tab)" : "no token") : "auth off";
  $("logout").hidden = !(state.authOn && token());
}

// -- panels -----------------------------------------------------------------------------------
const PANELS = {
  functions: { refresh: refreshFunctions, every: 1000 },
  invoke: { refresh: refreshFunctions, every: 3000 },
  streams: { refresh: refreshStreams, every: 1000 },
  metrics: { refresh: refreshMetrics, every: 1000 },
  jobs: { refresh: refreshJobs, every: 2000 },
  sessions: { refresh: refreshSessions, every: 1000 },
  apidocs: { refresh: refreshDocs, every: 0 },
};

function showPanel(name) {
  state.panel = name;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.panel === name);
  for (const p of document.querySelectorAll(".panel")) p.classList.toggle("active", p.id === "panel-" + name);
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  refreshPanel();
  const every = PANELS[name].every;
  if (every) state.timers.push(setInterval(refreshPanel, every));
}

function refreshPanel() {
  if (state.authOn && !token()) return;
  PANELS[state.panel].refresh().catch((err) => console.warn("refresh failed", err));
}

for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showPanel(b.dataset.panel));

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

// -- functions --------------------------------------------------------------------------------
async function refreshFunctions() {
  const r = await api("GET", "admin/v1/functions");
  $("functions-error").textContent = r.ok ? "" : errorText(r.data);
  if (!r.ok) return;
  state.functions = r.data.functions;
  const body = $("functions-table").tBodies[0];
  body.replaceChildren(...state.functions.map(functionRow));
  const select = $("invoke-fn");
  const chosen = select.value;
  const names = state.functions.map((f) => f.name);
  if (names.join() !== Array.from(select.options, (o) => o.value).join()) {
    select.replaceChildren(...names.map((n) => new Option(n, n)));
    if (names.includes(chosen)) select.value = chosen;
  }
}

function functionRow(f) {
  const s = f.status || {};
  const tr = document.createElement("tr");
  tr.dataset.name = f.name;
  tr.append(cell(f.name), cell(s.revision, "num"), cell(s.executor), cell(s.kind));
  for (const field of ["inflight", "invocations", "failures"]) {
    const td = cell(s[field], "num");
    td.dataset.field = field;
    tr.append(td);
  }
  const actions = document.createElement("td");
  const view = document.createElement("button");
  view.textContent = "manifest";
  view.addEventListener("click", () => showManifest(f.urn || f.name, f.name));
  const invoke = document.createElement("button");
  invoke.textContent = "invoke";
  invoke.addEventListener("click", () => { showPanel("invoke"); $("invoke-fn").value = f.name; });
  const del = document.createElement("button");
  del.textContent = "delete";
  del.addEventListener("click", () => deleteFunction(f.urn || f.name, f.name));
  actions.append(view, invoke, del);
  tr.append(actions);
  return tr;
}

// By URN: names are per tenant, and an admin token lists every tenant's functions.
async function showManifest(ref, name) {
  const r = await api("GET", "admin/v1/functions/" + encodeURIComponent(ref));
  $("manifest-name").textContent = name;
  if (!r.ok) { $("manifest-view").textContent = errorText(r.data); return; }
  const spec = Object.assign({}, r.data.function);
  const status = spec.status;
  delete spec.status;
  $("manifest-view").textContent = JSON.stringify(spec, null, 2) + "\n\n# status\n" + JSON.stringify(status, null, 2);
  $("deploy-text").value = JSON.stringify(spec, null, 2);  // JSON is YAML: edit and redeploy
}

async function deploy(replace) {
  const text = $("deploy-text").value;
  let path = "admin/v1/functions";
  if (replace) {
    const name = manifestName(text);
    if (!name) { $("deploy-result").textContent = "redeploy: the manifest names no function"; return; }
    path += "/" + encodeURIComponent(name);
  }
  const r = await api(replace ? "PUT" : "POST", path, { body: text, type: "application/yaml" });
  $("deploy-result").textContent = (r.ok ? r.status + " deployed\n" : r.status + " " + errorText(r.data) + "\n")
    + (r.ok ? JSON.stringify(r.data.functions.map((f) => f.name)) : "");
  refreshFunctions();
}

function manifestName(text) {
  try { const spec = JSON.parse(text); return spec && spec.name; } catch (_) { /* YAML */ }
  const match = /^name:\s*["']?([^"'\s#]+)/m.exec(text);
  return match ? match[1] : "";
}

async function deleteFunction(ref, name) {
  if (!confirm("Delete function " + name + "?")) return;
  const r = await api("DELETE", "admin/v1/functions/" + encodeURIComponent(ref));
  $("deploy-result").textContent = r.ok ? "deleted " + name : errorText(r.data);
  refreshFunctions();
}

$("deploy-btn").addEventListener("click", () => deploy(false));
$("redeploy-btn").addEventListener("click", () => deploy(true));

// -- invoke -----------------------------------------------------------------------------------
// Server-Sent Events from a fetch body, parsed as bytes arrive: onEvent({event, id, data}).
async function readSSE(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let ev = { event: "message", id: null, data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (ev.data.length) onEvent({ event: ev.event, id: ev.id, data: ev.data.join("\n") });
        ev = { event: "message", id: null, data: [] };
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") ev.data.push(value);
        else if (field === "event") ev.event = value;
        else if (field === "id") ev.id = value;
      }
    }
  }
}

// A stream whose connection drops before its end ([DONE]) is read on from the invocation's kept
// output (GET /serverless/v1/invocations/{id}/events with Last-Event-ID): every later event once,
// then the end. `seen` tracks {lastId, done}; gives up after RECONNECTS tries, on a 404 (not
// kept) or on an `event: error` (the kept window no longer reaches back).
const RECONNECTS = 5;

async function followStream(firstBody, invId, onEvent, seen, signal, onRetry) {
  const track = (ev) => {
    if (ev.id) seen.lastId = ev.id;
    if (ev.data === "[DONE]" || ev.event === "error") seen.done = true;
    onEvent(ev);
  };
  let body = firstBody;
  for (let attempt = 1; ; attempt++) {
    if (body) {
      try { await readSSE(body, track); } catch (err) { if (err.name === "AbortError") throw err; }
    }
    if (seen.done || !invId || attempt > RECONNECTS) return;
    onRetry(attempt);
    await new Promise((resolve) => setTimeout(resolve, 200 * attempt));
    if (signal.aborted) throw new DOMException("stopped", "AbortError");
    body = null;
    const headers = authHeaders({ Accept: "text/event-stream" });
    if (seen.lastId !== null) headers["Last-Event-ID"] = seen.lastId;
    try {
      const again = await fetch(apiUrl("serverless/v1/invocations/" + encodeURIComponent(invId) + "/events"),
                                { headers, signal });
      if (again.status === 404) return;
      if (again.ok) body = again.body;
    } catch (err) { if (err.name === "AbortError") throw err; }
  }
}

function resetInvokeOutput() {
  $("invoke-events").replaceChildren();
  for (const id of ["invoke-result", "invoke-error"]) $(id).textContent = "";
  for (const id of ["invoke-status", "invoke-trace", "invoke-time"]) $(id).textContent = "-";
}

function addEvent(list, data, ms, id) {
  const li = document.createElement("li");
  li.dataset.ms = String(Math.round(ms));
  li.dataset.at = String(Date.now());  // wall clock when it was shown (tests compare it)
  const at = document.createElement("span");
  at.className = "at";
  at.textContent = "+" + Math.round(ms) + " ms" + (id ? " #" + id : "");
  li.append(at, document.createTextNode(data));
  list.append(li);
  list.scrollTop = list.scrollHeight;
}

function looksLikeError(text) {
  try {
    const v = JSON.parse(text);
    return v && typeof v === "object" && typeof v.code === "number" && v.code !== 0 && typeof v.message === "string";
  } catch (_) { return false; }
}

async function sendInvoke() {
  if (state.invoke) return;
  const fn = $("invoke-fn").value;
  const mode = $("invoke-mode").value;
  const eventText = $("invoke-event").value;
  resetInvokeOutput();
  try { JSON.parse(eventText); } catch (err) { $("invoke-error").textContent = "the event is not JSON: " + err.message; return; }
  if (!fn) { $("invoke-error").textContent = "pick a function"; return; }
  const controller = new AbortController();
  const started = performance.now();
  const call = { fn, mode, event: eventText, at: new Date().toISOString(), status: "", trace: "", ms: 0 };
  state.invoke = controller;
  $("invoke-send").disabled = true;
  $("invoke-stop").disabled = false;
  $("invoke-status").textContent = "sending";
  const list = $("invoke-events");
  try {
    const resp = await fetch(apiUrl("serverless/v1/functions/" + encodeURIComponent(fn) + "/invocations"), {
      method: "POST", body: eventText, signal: controller.signal,
      headers: authHeaders({ "Content-Type": "application/json",
                             Accept: mode === "stream" ? "text/event-stream" : "application/json" }),
    });
    call.trace = resp.headers.get("X-Trace-Id") || "";
    const inner = resp.headers.get("X-Inner-Code");
    call.status = String(resp.status) + (inner ? " (X-Inner-Code " + inner + ")" : "");
    $("invoke-trace").textContent = call.trace;
    $("invoke-status").textContent = call.status + (resp.ok ? " streaming" : "");
    if (resp.status === 401 && state.authOn) askToken("The server refused the token.");
    if ((resp.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
      let last = null;
      state.invokeId = resp.headers.get("X-Invocation-Id");
      const seen = { lastId: null, done: false };
      await followStream(resp.body, state.invokeId, (ev) => {
        const ms = performance.now() - started;
        if (ev.data === "[DONE]") { addEvent(list, "[DONE]", ms, null); return; }
        addEvent(list, (ev.event !== "message" ? ev.event + ": " : "") + ev.data, ms, ev.id);
        last = ev.data;
      }, seen, controller.signal, (n) => { $("invoke-status").textContent = call.status + " reconnecting (" + n + ")"; });
      // A generator's items are its events and no result event follows them: its last item is not
      // a result. (Other handlers' last event is the result, unless they returned None.)
      const info = (state.functions || []).find((f) => f.name === fn);
      const generator = info && ["gen", "asyncgen"].includes(info.status.kind);
      if (last !== null && looksLikeError(last)) $("invoke-error").textContent = last;
      else if (last !== null && !generator) $("invoke-result").textContent = last;
      else $("invoke-result").textContent = "no result";
    } else {
      const text = await resp.text();
      let shown = text;
      try { shown = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { /* as sent */ }
      if (resp.ok) $("invoke-result").textContent = shown;
      else $("invoke-error").textContent = shown;
    }
    $("invoke-status").textContent = call.status;
  } catch (err) {
    if (err.name === "AbortError") {
      call.status = "stopped";
      $("invoke-status").textContent = "stopped (the function was cancelled)";
    } else {
      call.status = "failed";
      $("invoke-error").textContent = String(err);
    }
  } finally {
    call.ms = Math.round(performance.now() - started);
    $("invoke-time").textContent = call.ms + " ms";
    state.invoke = null;
    state.invokeId = null;
    $("invoke-send").disabled = false;
    $("invoke-stop").disabled = true;
    remember(call);
  }
}

// Stop is a cancel by id: a function with onDisconnect: continue would not stop at a dropped connection.
function stopInvoke() {
  if (!state.invoke) return;
  state.invoke.abort();
  if (state.invokeId) {
    fetch(apiUrl("serverless/v1/invocations/" + encodeURIComponent(state.invokeId) + "/cancel"),
          { method: "POST", headers: authHeaders({}) }).catch(() => {});
  }
}

function history() {
  try { return JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]"); } catch (_) { return []; }
}

function remember(call) {
  const calls = [call, ...history()].slice(0, HISTORY_SIZE);
  localStorage.setItem(HISTORY_KEY, JSON.stringify(calls));
  showHistory();
}

function showHistory() {
  $("invoke-history").replaceChildren(...history().map((c) => {
    const li = document.createElement("li");
    li.textContent = c.at.slice(11, 19) + " " + c.fn + " [" + c.mode + "] " + c.status + " " + c.ms + " ms " + c.event.slice(0, 60);
    li.title = "trace " + c.trace + " — click to load this call";
    li.addEventListener("click", () => {
      if (!Array.from($("invoke-fn").options, (o) => o.value).includes(c.fn)) $("invoke-fn").append(new Option(c.fn, c.fn));
      $("invoke-fn").value = c.fn;
      $("invoke-mode").value = c.mode;
      $("invoke-event").value = c.event;
    });
    return li;
  }));
}

$("invoke-send").addEventListener("click", sendInvoke);
$("invoke-stop").addEventListener("click", stopInvoke);
$("invoke-event").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) sendInvoke(); });

// -- named streams ----------------------------------------------------------------------------
async function refreshStreams() {
  const r = await api("GET", "serverless/v1/streams");
  if (!r.ok) return;
  $("streams-table").tBodies[0].replaceChildren(...r.data.streams.map((s) => {
    const tr = document.createElement("tr");
    tr.dataset.name = s.name;
    tr.append(cell(s.name), cell(s.producers, "num"), cell(s.consumers, "num"), cell(s.produced, "num"),
              cell(s.delivered, "num"), cell(s.dropped, "num"), cell(s.retained, "num"), cell(s.retained_bytes, "num"));
    tr.addEventListener("click", () => { $("sub-name").value = s.name; $("pub-name").value = s.name; });
    return tr;
  }));
}

function subscribe() {
  const name = $("sub-name").value.trim();
  if (!name) return;
  unsubscribe();
  const list = $("sub-elements");
  list.replaceChildren();
  let u = apiUrl("serverless/v1/streams/" + encodeURIComponent(name));
  if (token()) u += "?token=" + encodeURIComponent(token());  // EventSource cannot send headers
  const source = new EventSource(u);
  const opened = performance.now();
  state.subscription = source;
  $("sub-state").textContent = "connecting to " + name;
  source.onopen = () => { $("sub-state").textContent = "subscribed to " + name; };
  source.onmessage = (e) => addEvent(list, e.data, performance.now() - opened, e.lastEventId);
  source.addEventListener("binary", (e) => addEvent(list, "(binary, base64) " + e.data, performance.now() - opened, e.lastEventId));
  source.addEventListener("end", (e) => { addEvent(list, "end: " + e.data, performance.now() - opened, null); unsubscribe(); });
  source.addEventListener("error", (e) => {
    if (e.data) addEvent(list, "error: " + e.data, performance.now() - opened, null);  // the server's `event: error`
    else if (source.readyState === EventSource.CONNECTING) $("sub-state").textContent = "reconnecting (resumes after the last id)";
  });
  $("sub-start").disabled = true;
  $("sub-stop").disabled = false;
}

function unsubscribe() {
  if (state.subscription) state.subscription.close();
  state.subscription = null;
  $("sub-start").disabled = false;
  $("sub-stop").disabled = true;
  if ($("sub-state").textContent.startsWith("subscribed")) $("sub-state").textContent = "unsubscribed";
}

async function publish() {
  const name = $("pub-name").value.trim();
  if (!name) return;
  const r = await api("POST", "serverless/v1/streams/" + encodeURIComponent(name),
                      { body: JSON.stringify([$("pub-text").value]) });
  $("pub-result").textContent = r.ok ? "published, id " + r.data.ids.join(", ") : errorText(r.data);
  refreshStreams();
}

$("sub-start").addEventListener("click", subscribe);
$("sub-stop").addEventListener("click", unsubscribe);
$("pub-send").addEventListener("click", publish);

// -- metrics ----------------------------------------------------------------------------------
function parseMetrics(text) {
  const sums = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const value = Number(match[3]);
    if (Number.isNaN(value)) continue;
    sums[match[1]] = (sums[match[1]] || 0) + value;
    const status = /status="([^"]*)"/.exec(match[2] || "");  // fnstream_jobs{...,status="queued"}
    if (status) sums[match[1] + ":" + status[1]] = (sums[match[1] + ":" + status[1]] || 0) + value;
  }
  return sums;
}

const SHOWN = [
  ["fnstream_invocations_total", "invocations"], ["fnstream_inflight", "inflight"],
  ["fnstream_stream_events_total", "events streamed"], ["fnstream_stream_bytes_total", "bytes streamed"],
  ["fnstream_throttled_total", "429s"], ["fnstream_timeouts_total", "timeouts"],
  ["fnstream_client_disconnects_total", "client disconnects"], ["fnstream_heartbeats_total", "heartbeats"],
  ["fnstream_streams", "named streams"], ["fnstream_stream_produced_total", "stream elements produced"],
  ["fnstream_stream_subscribers", "stream subscribers"], ["fnstream_cluster_workers_alive", "cluster workers"],
  ["fnstream_jobs:queued", "jobs queued"], ["fnstream_jobs:running", "jobs running"],
  ["fnstream_jobs:completed", "jobs completed"], ["fnstream_jobs:failed", "jobs failed"],
  ["fnstream_jobs:cancelled", "jobs cancelled"], ["fnstream_jobs:timed_out", "jobs timed out"],
  ["fnstream_sessions", "instance sessions open"],
];

async function refreshMetrics() {
  const resp = await fetch(apiUrl("metrics"), { headers: authHeaders({ Accept: "text/plain" }) });
  const text = await resp.text();
  if (!resp.ok) { $("metrics-error").textContent = resp.status + " " + errorText(safeJSON(text)); return; }
  $("metrics-error").textContent = "";
  const now = performance.now();
  const sums = parseMetrics(text);
  const m = state.metrics;
  if (m.last) {
    const dt = (now - m.last.at) / 1000;
    const rate = (name) => Math.max(0, ((sums[name] || 0) - (m.last.sums[name] || 0)) / dt);
    m.points.push({ inv: rate("fnstream_invocations_total"), ev: rate("fnstream_stream_events_total") });
    if (m.points.length > 60) m.points.shift();
  }
  m.last = { at: now, sums };
  $("metrics-table").tBodies[0].replaceChildren(...SHOWN.filter(([n]) => n in sums).map(([n, label]) => {
    const tr = document.createElement("tr");
    tr.dataset.metric = n;
    tr.append(cell(label), cell(sums[n], "num"));
    return tr;
  }));
  drawChart();
}

function safeJSON(text) { try { return JSON.parse(text); } catch (_) { return text; } }

function drawChart() {
  const canvas = $("metrics-chart");
  const g = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 30;
  const points = state.metrics.points;
  g.clearRect(0, 0, w, h);
  const top = Math.max(1, ...points.map((p) => Math.max(p.inv, p.ev)));
  g.strokeStyle = "#d8dee4";
  g.fillStyle = "#6a737d";
  g.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const y = pad + ((h - 2 * pad) * i) / 4;
    g.beginPath(); g.moveTo(pad, y); g.lineTo(w - 5, y); g.stroke();
    g.fillText(String(Number((top * (1 - i / 4)).toPrecision(2))), 2, y + 4);
  }
  const line = (key, color) => {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    points.forEach((p, i) => {
      const x = w - 5 - ((w - pad - 5) * (points.length - 1 - i)) / 59;  // newest at the right, 1 s apart
      const y = h - pad - ((h - 2 * pad) * p[key]) / top;
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke(); g.lineWidth = 1;
  };
  line("inv", "#0b6bcb");
  line("ev", "#c2410c");
  g.fillText("last 60 s, per second", w - 130, h - 8);
}

// -- jobs -------------------------------------------------------------------------------------
async function refreshJobs() {
  const r = await api("GET", "serverless/v1/jobs?limit=100");
  $("jobs-error").textContent = r.ok ? "" : errorText(r.data);
  if (!r.ok) return;
  const jobs = r.data.jobs || [];
  $("jobs-state").textContent = jobs.length ? "" : "No jobs yet (fnstream invoke NAME --async, or RunPod's /v2/NAME/run).";
  $("jobs-table").tBodies[0].replaceChildren(...jobs.map((j) => {
    const tr = document.createElement("tr");
    tr.dataset.id = j.id;
    tr.dataset.status = j.status;
    const error = j.error ? j.error.message : "";
    tr.append(cell(j.id), cell(j.function), cell(j.status), cell(j.api), cell(j.createdAt),
      cell(j.delayTime, "num"), cell(j.executionTime, "num"), cell(j.outputCount, "num"), cell(error));
    return tr;
  }));
}

// -- instance sessions ------------------------------------------------------------------------
// The admin list already carries each function's live sessions (status.sessions): one call, the
// token's tenant only (an admin token sees every tenant's, but may only end its own tenant's).
async function refreshSessions() {
  const r = await api("GET", "admin/v1/functions");
  $("sessions-error").textContent = r.ok ? "" : errorText(r.data);
  if (!r.ok) return;
  const rows = [];
  for (const f of r.data.functions) {
    for (const s of (f.status && f.status.sessions) || []) rows.push(sessionRow(f.name, s));
  }
  $("sessions-table").tBodies[0].replaceChildren(...rows);
  $("sessions-state").textContent = rows.length ? "" :
    'No live sessions. A call with the header X-Instance-Session: {"sessionID": "..."} opens one.';
}

function sessionRow(fn, s) {
  const tr = document.createElement("tr");
  tr.dataset.fn = fn;
  tr.dataset.session = s.sessionID;
  tr.dataset.running = String(s.running);
  const expires = s.expiresInSeconds === null ? "(running)" : s.expiresInSeconds.toFixed(1);
  tr.append(cell(fn), cell(s.sessionID), cell(s.turns, "num"), cell(s.running, "num"),
            cell(s.ageSeconds.toFixed(1), "num"), cell(s.sessionTTL, "num"), cell(expires, "num"),
            cell(s.pid === null ? "(in-process)" : "pid " + s.pid));
  const actions = document.createElement("td");
  for (const [label, method, suffix] of [["interrupt", "POST", "/interrupt"], ["delete", "DELETE", ""]]) {
    const b = document.createElement("button");
    b.textContent = label;
    b.addEventListener("click", () => sessionAction(fn, s.sessionID, method, suffix));
    actions.append(b);
  }
  tr.append(actions);
  return tr;
}

async function sessionAction(fn, sid, method, suffix) {
  const path = "serverless/v1/functions/" + encodeURIComponent(fn) + "/sessions/" + encodeURIComponent(sid) + suffix;
  const r = await api(method, path);
  $("sessions-result").textContent = method + " " + path + "\n" + r.status + " "
    + (r.ok ? JSON.stringify(r.data) : errorText(r.data));
  refreshSessions();
}

// -- API docs ---------------------------------------------------------------------------------
async function refreshDocs() {
  const r = await api("GET", "openapi.json");
  const root = $("apidocs");
  if (!r.ok) { root.textContent = errorText(r.data); return; }
  const doc = r.data;
  const byTag = {};
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      const tag = (op.tags && op.tags[0]) || "other";
      (byTag[tag] = byTag[tag] || []).push({ path, method, op });
    }
  }
  const sections = [];
  const order = ["invoke", "streams", "openai", "admin", "operations", "health", "console"];
  const rank = (t) => (order.indexOf(t) < 0 ? order.length : order.indexOf(t));
  for (const [tag, ops] of Object.entries(byTag).sort((a, b) => rank(a[0]) - rank(b[0]))) {
    const h = document.createElement("h3");
    h.textContent = tag;
    sections.push(h);
    for (const { path, method, op } of ops) sections.push(operation(doc, path, method, op));
  }
  root.replaceChildren(...sections);
}

function resolve(doc, schema) {
  if (schema && schema.$ref) {
    const name = schema.$ref.split("/").pop();
    return { name, schema: (doc.components.schemas || {})[name] };
  }
  return { name: "", schema };
}

function operation(doc, path, method, op) {
  const d = document.createElement("details");
  d.className = "op";
  d.dataset.path = path;
  d.dataset.method = method;
  const s = document.createElement("summary");
  const m = document.createElement("span");
  m.className = "method";
  m.textContent = method.toUpperCase();
  s.append(m, document.createTextNode(path + " — " + (op.summary || "")));
  d.append(s);
  const parts = [];
  if (op.description) parts.push(op.description);
  if (op.requestBody) {
    for (const [type, media] of Object.entries(op.requestBody.content || {})) {
      const { name, schema } = resolve(doc, media.schema);
      parts.push("request " + type + (name ? " (" + name + ")" : "") + ":\n" + JSON.stringify(schema || {}, null, 2));
    }
  }
  for (const [code, resp] of Object.entries(op.responses || {})) {
    let line = code + " " + (resp.description || "");
    for (const [type, media] of Object.entries(resp.content || {})) {
      const { name } = resolve(doc, media.schema);
      line += "  [" + type + (name ? " " + name : "") + "]";
    }
    parts.push(line);
  }
  const pre = document.createElement("pre");
  pre.textContent = parts.join("\n\n");
  d.append(pre);
  return d;
}

// -- start ------------------------------------------------------------------------------------
async function start() {
  showHistory();
  try {
    const health = await (await fetch(apiUrl("healthz"))).json();
    state.authOn = Boolean(health.auth);
  } catch (_) { state.authOn = false; }
  showWho();
  if (state.authOn && !token()) askToken("");
  showPanel("functions");
}

start();
