// Runs the console's followStream (frontend/console/console.js) in node against a live server:
// an SSE invocation whose connection drops after two events, then the console reading on.
// Usage: node console_resume.js CONSOLE_JS SERVER_URL FUNCTION EVENT_JSON; prints {events, retries} as JSON.
"use strict";
const fs = require("fs");
const vm = require("vm");

const [consoleJs, base, fn, eventJson] = process.argv.slice(2);
// Whatever the page's top level touches of the DOM: one object that is any element, any method.
const el = new Proxy(function () {}, {
  get: (_t, key) => (key === Symbol.toPrimitive ? () => "" : el),
  apply: () => el,
  set: () => true,
});
const context = vm.createContext({
  document: { getElementById: () => el, createElement: () => el, querySelectorAll: () => [] },
  location: { href: base + "/console/" },
  sessionStorage: { getItem: () => null, setItem() {}, removeItem() {} },
  localStorage: { getItem: () => null, setItem() {} },
  fetch, URL, DOMException, TextDecoder, setTimeout, clearTimeout, AbortController, performance, console,
});
vm.runInContext(fs.readFileSync(consoleJs, "utf8").replace(/\nstart\(\);\s*$/, "\n"), context);

function dropAfter(body, events) {
  const reader = body.getReader();
  let seen = 0;
  return new ReadableStream({
    async pull(ctrl) {
      const { value, done } = await reader.read();
      if (done) { ctrl.close(); return; }
      const text = new TextDecoder().decode(value);
      let end = 0;
      while (seen < events) {
        const at = text.indexOf("\n\n", end);
        if (at < 0) break;
        end = at + 2;
        seen += 1;
      }
      if (seen < events) { ctrl.enqueue(value); return; }
      ctrl.enqueue(new TextEncoder().encode(text.slice(0, end)));
      await reader.cancel();  // the connection goes: a drop mid-stream
      ctrl.close();
    },
  });
}

(async () => {
  const resp = await fetch(base + "/serverless/v1/functions/" + fn + "/invocations", {
    method: "POST", body: eventJson, headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
  });
  const events = [];
  const retries = [];
  const seen = { lastId: null, done: false };
  await context.followStream(dropAfter(resp.body, 2), resp.headers.get("X-Invocation-Id"), (ev) => events.push(ev),
                             seen, new AbortController().signal, (n) => retries.push(n));
  process.stdout.write(JSON.stringify({ events, retries, done: seen.done }));
})().catch((err) => { process.stderr.write(String(err.stack || err)); process.exit(1); });
